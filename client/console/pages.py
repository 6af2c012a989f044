"""The console's HTML: one layout and one function per page, from the admin client's answers.

Everything that comes from the broker, a message or the user is escaped here, by
:func:`esc` or by :func:`table` (a cell is escaped unless it is :class:`Raw`, HTML this module
made).  No script, no external asset: the style sheet is inline and the pages work without
JavaScript (an action is confirmed on a page of its own).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from txmq.protocol.message import MessageConst, MessageExt
from txmq.protocol.topics import DLQ_GROUP_TOPIC_PREFIX, INTERNAL_TOPICS, RETRY_GROUP_TOPIC_PREFIX

#: Bytes of a message body the message page shows.
BODY_PREVIEW = 4096

STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1d2630;
background:#f5f7fa;font-size:14px}
header{background:#1f3a5f;color:#fff;padding:10px 24px;display:flex;align-items:center;gap:24px}
header .brand{font-weight:700;font-size:17px}
header nav a{color:#dce7f5;text-decoration:none;margin-right:14px;white-space:nowrap}
header nav a.on{color:#fff;font-weight:600;border-bottom:2px solid #fff}
header .who{margin-left:auto;display:flex;gap:10px;align-items:center;color:#dce7f5;
white-space:nowrap}
header .who button{background:none;border:1px solid #dce7f5;color:#fff;border-radius:3px;
cursor:pointer}
main{padding:16px 24px;max-width:1200px}
h1{font-size:21px;margin:6px 0 14px}
h2{font-size:16px;margin:22px 0 8px}
table{border-collapse:collapse;background:#fff;margin-bottom:12px;min-width:380px}
th,td{border:1px solid #d7dee8;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#e9eef5;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
table.kv th{width:230px}
code,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px}
pre{background:#fff;border:1px solid #d7dee8;padding:10px;white-space:pre-wrap;
word-break:break-all;max-width:1100px}
.notice{padding:10px 14px;border-radius:4px;margin:10px 0;max-width:900px}
.ok{background:#e3f4e6;border:1px solid #8cc79a}
.refused{background:#fbe4e4;border:1px solid #d98b8b}
.info{background:#e8f0fb;border:1px solid #9db7dc}
.lag{color:#b23b00;font-weight:600}
.state-PENDING{color:#8a5a00;font-weight:600}
.state-DISCARDED{color:#b23b00;font-weight:600}
form.inline{display:inline}
button.act{padding:5px 14px;margin-right:8px;border-radius:3px;border:1px solid #889;cursor:pointer}
button.commit{background:#2e7d32;color:#fff;border-color:#2e7d32}
button.rollback{background:#c62828;color:#fff;border-color:#c62828}
button.resume{background:#1f5fa8;color:#fff;border-color:#1f5fa8}
label{display:block;margin:8px 0 3px}
input[type=text],input[type=password]{padding:5px;width:320px}
.muted{color:#68717c}
.charts{display:flex;flex-wrap:wrap;gap:14px}
.charts figure{margin:0}
.charts figcaption{font-weight:600;margin-bottom:4px}
.role{border:1px solid #dce7f5;border-radius:3px;padding:0 5px;font-size:12px}
"""

NAV = (
    ("overview", "/", "Overview"),
    ("topics", "/topics", "Topics"),
    ("groups", "/groups", "Consumer groups"),
    ("transactions", "/transactions", "Transactions"),
    ("messages", "/messages", "Messages"),
    ("search", "/search", "Key search"),
    ("trace", "/trace", "Trace"),
    ("dlq", "/dlq", "Dead letters"),
)


class Raw(str):
    """HTML made by this module: put into a page as it is."""


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def cell(value: object) -> str:
    return value if isinstance(value, Raw) else esc(value)


def link(href: str, text: object) -> Raw:
    return Raw(f'<a href="{esc(href)}">{esc(text)}</a>')


def path(*segments: str, **query: str | None) -> str:
    """A console URL: each segment quoted whole (a topic or group name may hold any
    character), then the query."""
    url = "/" + "/".join(quote(s, safe="") for s in segments)
    q = {k: v for k, v in query.items() if v}
    return url + ("?" + urlencode(q) if q else "")


def num(value: object) -> Raw:
    return Raw(f'<span class="num">{esc(value)}</span>')


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    numeric: Iterable[int] = (),
    empty: str = "none",
    css_id: str = "",
) -> Raw:
    right = set(numeric)
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        tds = "".join(
            f'<td class="num">{cell(v)}</td>' if i in right else f"<td>{cell(v)}</td>"
            for i, v in enumerate(row)
        )
        body.append(f"<tr>{tds}</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(headers)}" class="muted">{esc(empty)}</td></tr>')
    ident = f' id="{esc(css_id)}"' if css_id else ""
    return Raw(
        f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def kv(pairs: Iterable[tuple[str, object]], css_id: str = "") -> Raw:
    ident = f' id="{esc(css_id)}"' if css_id else ""
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{cell(v)}</td></tr>" for k, v in pairs)
    return Raw(f'<table class="kv"{ident}>{rows}</table>')


def notice(kind: str, text: object, css_id: str = "notice") -> Raw:
    return Raw(f'<div class="notice {esc(kind)}" id="{esc(css_id)}">{cell(text)}</div>')


def when(ms: int | float | None) -> str:
    if not ms or ms <= 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(ms: int | float | None) -> str:
    if ms is None:
        return "-"
    s = max(0.0, ms / 1000)
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def layout(
    title: str,
    content: str,
    *,
    active: str = "",
    broker: str = "",
    user: str | None = None,
    role: str | None = None,
    csrf: str = "",
) -> str:
    nav = "".join(
        f'<a href="{href}" class="{"on" if key == active else ""}">{label}</a>'
        for key, href, label in NAV
    )
    who = ""
    if user is not None:
        who = (
            f'<span>signed in as <b id="user">{esc(user)}</b></span>'
            + (f'<span class="role" id="role">{esc(role)}</span>' if role else "")
            + f'<form class="inline" method="post" action="/logout">'
            f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
            f'<button type="submit" id="logout">sign out</button></form>'
        )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · txmq console</title><style>{STYLE}</style></head><body>"
        f'<header><span class="brand">txmq</span><nav>{nav}</nav>'
        f'<span class="who"><span class="muted">broker {esc(broker)}</span>{who}</span></header>'
        f"<main><h1>{esc(title)}</h1>{content}</main></body></html>"
    )


# -- pages ------------------------------------------------------------------------------------


def chart_box(caption: str, svg: str) -> str:
    return f"<figure><figcaption>{esc(caption)}</figcaption>{svg}</figure>"


def overview(
    info: dict[str, Any], cluster: dict[str, Any] | None, charts: str | None = None
) -> str:
    me = (cluster or {}).get("self") or {}
    role = (
        f"{me.get('role', '?')} (replica {me.get('replicaId', '?')} of group {me.get('group', '?')})"
        if cluster
        else "single node"
    )
    disk = info.get("store.disk_used_ratio")
    pairs: list[tuple[str, object]] = [
        ("broker name", info.get("brokerName")),
        ("version", info.get("brokerVersion")),
        ("address", info.get("address")),
        ("role", role),
        ("uptime", duration(info.get("uptimeMs"))),
        ("flush", info.get("flushDiskType")),
        ("disk used", f"{float(disk):.1f} %" if disk is not None else "-"),
        (
            "commit log",
            f"{info.get('store.commit_log_min_offset', 0)} .. "
            f"{info.get('store.commit_log_max_offset', 0)} bytes, "
            f"{info.get('store.commit_log_segments', 0)} segment(s)",
        ),
        ("unflushed", f"{info.get('store.commit_log_unflushed_bytes', 0)} bytes"),
        ("topics", info.get("topics")),
        ("connections", info.get("connections")),
        ("producer groups online", ", ".join(sorted(info.get("producerGroups") or {})) or "-"),
        ("consumer groups online", ", ".join(sorted(info.get("consumerGroups") or {})) or "-"),
    ]
    txn = [
        ("pending", info.get("txn.pending", 0)),
        ("parked (checks exhausted)", info.get("txn.discarded", 0)),
        ("committed", info.get("txn.committed", 0)),
        ("rolled back", info.get("txn.rolledBack", 0)),
        ("check rounds", info.get("txn.checkRounds", 0)),
    ]
    out: list[str] = []
    if charts is not None:
        out += ["<h2>Over time</h2>", f'<div class="charts" id="charts">{charts}</div>']
    out += [kv(pairs, "broker"), "<h2>Transactions</h2>", kv(txn, "txn-summary")]
    if cluster:
        out.append(f"<h2>Cluster {esc(cluster.get('cluster'))}</h2>")
        rows = []
        for name, g in sorted((cluster.get("groups") or {}).items()):
            leader = g.get("leader")
            rows.append(
                [
                    name,
                    f"replica {leader['replicaId']} at {leader['addr']}" if leader else "NONE",
                    g.get("epoch"),
                    ", ".join(f"{k}={v}" for k, v in sorted((g.get("members") or {}).items())),
                    ", ".join(str(x) for x in g.get("inSync") or []),
                    ", ".join(f"{k}: {v} B" for k, v in sorted((g.get("lag") or {}).items()))
                    or "-",
                    ", ".join(g.get("topics") or []) or "-",
                ]
            )
        out.append(
            table(
                ["group", "leader", "epoch", "replicas", "in sync", "replica lag", "topics"],
                rows,
                css_id="cluster",
            )
        )
    return "".join(out)


def topics(rows: list[dict[str, Any]], show_all: bool) -> str:
    body = []
    for r in rows:
        body.append(
            [
                link(path("topics", r["name"]), r["name"]),
                r["readQueueNums"],
                r["writeQueueNums"],
                perm_name(r["perm"]),
                "yes" if r.get("order") else "no",
                r["messages"],
                ", ".join(r["groups"]) or "-",
            ]
        )
    toggle = (
        link("/topics", "hide system, retry and dead-letter topics")
        if show_all
        else link(path("topics", all="1"), "show system, retry and dead-letter topics")
    )
    return (
        table(
            ["topic", "read queues", "write queues", "perm", "ordered", "messages", "groups"],
            body,
            numeric=(1, 2, 5),
            empty="no topics",
            css_id="topics",
        )
        + f"<p>{toggle}</p>"
    )


def perm_name(perm: int) -> str:
    names = [n for n, bit in (("R", 4), ("W", 2), ("X", 1)) if perm & bit]
    return "".join(names) or "-"


def topic(name: str, config: dict[str, Any] | None, stats: dict[str, Any]) -> str:
    groups = sorted(stats.get("consumerOffsets") or {})
    offsets = stats.get("consumerOffsets") or {}
    rows = []
    for q in stats.get("offsetTable") or []:
        qid = q["queueId"]
        row: list[object] = [qid, q["minOffset"], q["maxOffset"], q["maxOffset"] - q["minOffset"]]
        for g in groups:
            committed = offsets[g].get(str(qid))
            if committed is None:
                row.append("-")
            else:
                behind = max(0, q["maxOffset"] - committed)
                row.append(
                    Raw(f"{esc(committed)} <span class='lag'>(+{behind})</span>")
                    if behind
                    else committed
                )
        rows.append(row)
    head = ["queue", "min offset", "max offset", "messages"] + [f"{g} committed" for g in groups]
    out: list[str] = []
    if config is not None:
        out.append(
            kv(
                [
                    (
                        "read / write queues",
                        f"{config['readQueueNums']} / {config['writeQueueNums']}",
                    ),
                    ("perm", perm_name(config["perm"])),
                    ("ordered", "yes" if config.get("order") else "no"),
                ],
                "topic-config",
            )
        )
    out.append("<h2>Queues and committed offsets</h2>")
    out.append(table(head, rows, numeric=range(len(head)), css_id="queues"))
    if groups:
        out.append(
            "<p>Consumer groups: "
            + ", ".join(link(path("groups", g), g) for g in groups)
            + '. <span class="lag">(+n)</span>: messages not consumed yet.</p>'
        )
    return "".join(out)


def groups(rows: list[dict[str, Any]]) -> str:
    body = [
        [
            link(path("groups", r["group"]), r["group"]),
            r["members"],
            ", ".join(r["topics"]) or "-",
            Raw(f"<span class='lag'>{r['lag']}</span>") if r["lag"] else 0,
        ]
        for r in rows
    ]
    return table(
        ["group", "consumers online", "topics", "lag"],
        body,
        numeric=(1, 3),
        empty="no consumer groups",
        css_id="groups",
    )


def group(
    name: str,
    stats: list[dict[str, Any]],
    conns: dict[str, Any],
    chart: str | None = None,
    can_act: bool = False,
) -> str:
    rows = [
        [
            link(path("topics", s["topic"]), s["topic"]),
            s["queueId"],
            s["brokerOffset"],
            s["consumerOffset"],
            Raw(f"<span class='lag'>{s['lag']}</span>") if s["lag"] else 0,
            when(s.get("lastTimestamp")),
        ]
        for s in stats
    ]
    members = [
        [c.get("clientId"), c.get("clientAddr"), c.get("language"), c.get("version")]
        for c in conns.get("connectionSet") or []
    ]
    subs = []
    for sub in (conns.get("subscriptionTable") or {}).values():
        if isinstance(sub, dict):
            subs.append([sub.get("topic"), sub.get("subString")])
    total = sum(s["lag"] for s in stats)
    return "".join(
        [
            kv(
                [
                    ("consumers online", len(members)),
                    ("total lag", total),
                    ("consume type", conns.get("consumeType") or "-"),
                    ("message model", conns.get("messageModel") or "-"),
                ],
                "group-summary",
            ),
            f'<div class="charts">{chart}</div>' if chart else "",
            (f"<p>{link(path('groups', name, 'reset'), 'Reset offsets…')} · " if can_act else "<p>")
            + f"{link(path('dlq', group=name), 'dead letters')}</p>",
            "<h2>Lag per queue</h2>",
            table(
                ["topic", "queue", "queue end", "committed", "lag", "last consumed (stored at)"],
                rows,
                numeric=(1, 2, 3, 4),
                empty="no committed offsets",
                css_id="lag",
            ),
            "<h2>Members</h2>",
            table(
                ["client id", "address", "language", "version"],
                members,
                empty="no consumer of this group is online",
                css_id="members",
            ),
            "<h2>Subscriptions</h2>",
            table(["topic", "expression"], subs, empty="-", css_id="subscriptions"),
        ]
    )


def _topics_of(t: dict[str, Any]) -> list[str]:
    return sorted({h["topic"] for h in t.get("halves") or []})


def transactions(
    txns: list[dict[str, Any]], group: str | None, topic: str | None, state: str
) -> str:
    # pending and parked halves by producer group and topic
    summary: dict[tuple[str, str], dict[str, Any]] = {}
    for t in txns:
        for tp in _topics_of(t) or ["-"]:
            s = summary.setdefault(
                (t["producerGroup"], tp), {"PENDING": 0, "DISCARDED": 0, "oldest": 0}
            )
            halves = sum(1 for h in t.get("halves") or [] if h["topic"] == tp)
            s[t["state"]] = s.get(t["state"], 0) + halves
            s["oldest"] = max(s["oldest"], t.get("ageMs") or 0)
    sum_rows = [
        [
            link(path("transactions", group=g), g),
            link(path("transactions", topic=tp), tp) if tp != "-" else "-",
            s["PENDING"],
            s["DISCARDED"],
            duration(s["oldest"]),
        ]
        for (g, tp), s in sorted(summary.items())
    ]
    rows = [
        [
            link(path("transactions", t["transactionId"]), t["transactionId"]),
            Raw(f"<span class='state-{esc(t['state'])}'>{esc(state_name(t['state']))}</span>"),
            t["producerGroup"],
            ", ".join(_topics_of(t)) or "-",
            len(t.get("halves") or []),
            duration(t.get("ageMs")),
            t["checkTimes"],
            when(t.get("lastCheckTimestamp")),
        ]
        for t in txns
    ]
    options = "".join(
        f'<option value="{v}"{" selected" if v == state else ""}>{label}</option>'
        for v, label in (
            ("PENDING,DISCARDED", "pending and parked"),
            ("PENDING", "pending"),
            ("DISCARDED", "parked"),
            ("COMMITTED", "committed"),
            ("ROLLED_BACK", "rolled back"),
        )
    )
    filters = (
        '<form method="get" action="/transactions" id="filter">'
        f'producer group <input type="text" name="group" value="{esc(group or "")}" '
        'style="width:160px"> '
        f'topic <input type="text" name="topic" value="{esc(topic or "")}" style="width:160px"> '
        f'<select name="state">{options}</select> <button type="submit">filter</button></form>'
    )
    return "".join(
        [
            filters,
            "<h2>By producer group and topic</h2>",
            table(
                ["producer group", "topic", "pending halves", "parked halves", "oldest"],
                sum_rows,
                numeric=(2, 3),
                empty="no transactions",
                css_id="by-group",
            ),
            "<h2>Transactions</h2>",
            table(
                ["transaction id", "state", "producer group", "topics", "messages", "age"]
                + ["checks sent", "last check"],
                rows,
                numeric=(4, 6),
                empty="no transactions",
                css_id="transactions",
            ),
        ]
    )


def state_name(state: str) -> str:
    return {"DISCARDED": "PARKED"}.get(state, state)


ACTIONS = {
    "commit": ("Commit", "its messages are delivered to consumers"),
    "rollback": ("Roll back", "its messages are dropped"),
    "resume": ("Resume checking", "the broker asks its producer group again"),
}


def transaction(t: dict[str, Any], can_act: bool = True) -> str:
    halves = [
        [
            link(path("topics", h["topic"]), h["topic"]),
            h["queueId"],
            h.get("msgId") or "-",
            link(path("messages", id=h["offsetMsgId"]), h["offsetMsgId"]),
            when(h.get("storeTimestamp")),
        ]
        for h in t.get("halves") or []
    ]
    pairs: list[tuple[str, object]] = [
        ("transaction id", t["transactionId"]),
        (
            "state",
            Raw(f"<span class='state-{esc(t['state'])}'>{esc(state_name(t['state']))}</span>"),
        ),
        ("producer group", t["producerGroup"]),
        ("age", duration(t.get("ageMs"))),
        ("checks sent", t.get("checkTimes")),
        ("last check", when(t.get("lastCheckTimestamp"))),
    ]
    if t.get("batchKey"):
        pairs.append(("batch", t["batchKey"]))
    if t.get("decidedBy"):
        pairs += [
            ("decided by", t["decidedBy"]),
            ("decided at", when(t.get("decidedTimestamp"))),
        ]
    if t.get("remark"):
        pairs.append(("remark", t["remark"]))
    out: list[str] = [kv(pairs, "txn"), "<h2>Messages</h2>"]
    out.append(
        table(
            ["topic", "queue", "message id", "offset message id", "stored"],
            halves,
            numeric=(1,),
            css_id="halves",
        )
    )
    possible = {"PENDING": ("commit", "rollback"), "DISCARDED": ("commit", "rollback", "resume")}
    acts = possible.get(t["state"], ()) if can_act else ()
    out.append(f"<p>{link(path('trace', key=t['transactionId']), 'trace of this transaction')}</p>")
    if acts:
        buttons = "".join(
            f'<a href="{esc(path("transactions", t["transactionId"], "confirm", action=a))}">'
            f'<button type="button" class="act {a}" id="{a}">{ACTIONS[a][0]}…</button></a>'
            for a in acts
        )
        out.append(f"<h2>Actions</h2><p>{buttons}</p>")
    return "".join(out)


def confirm(t: dict[str, Any], action: str, csrf: str, user: str | None) -> str:
    label, effect = ACTIONS[action]
    who = f" as <b>{esc(user)}</b>" if user else ""
    return (
        f"<p>{esc(label)} transaction <code>{esc(t['transactionId'])}</code> of producer group "
        f"<b>{esc(t['producerGroup'])}</b> ({len(t.get('halves') or [])} message(s), "
        f"{esc(state_name(t['state']))}){who}: {esc(effect)}.</p>"
        f'<form method="post" action="{esc(path("transactions", t["transactionId"], action))}" '
        'id="confirm-form">'
        f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
        '<label for="reason">reason (recorded with the decision)</label>'
        '<input type="text" id="reason" name="reason" maxlength="200">'
        f'<p><button type="submit" class="act {esc(action)}" id="confirm">'
        f"Yes, {esc(label.lower())}</button> "
        f"{link(path('transactions', t['transactionId']), 'cancel')}</p></form>"
    )


def action_result(transaction_id: str, ok: bool, text: str) -> str:
    back = link(path("transactions", transaction_id), "back to the transaction")
    kind = "ok" if ok else "refused"
    return str(notice(kind, text)) + f"<p>{back} · {link('/transactions', 'all transactions')}</p>"


def message_form(msg_id: str, topic: str) -> str:
    return (
        '<form method="get" action="/messages" id="lookup">'
        '<label for="id">message id or offset message id (32 hex digits, as '
        "<code>txmq send</code>, <code>txmq consume</code> and the transaction page show "
        "them)</label>"
        f'<input type="text" id="id" name="id" value="{esc(msg_id)}"> '
        '<label for="topic">topic (optional: without it every topic is searched)</label>'
        f'<input type="text" id="topic" name="topic" value="{esc(topic)}"> '
        '<button type="submit">show</button></form>'
    )


def message(msg: MessageExt, msg_id: str) -> str:
    body = msg.body or b""
    preview = body[:BODY_PREVIEW]
    text = preview.decode("utf-8", errors="replace")
    printable = all(ch.isprintable() or ch in "\r\n\t" for ch in text)
    shown = text if printable else preview.hex(" ", 1)
    cut = f" (first {BODY_PREVIEW} shown)" if len(body) > BODY_PREVIEW else ""
    real = msg.properties.get(MessageConst.REAL_TOPIC)
    pairs: list[tuple[str, object]] = [
        (
            "topic",
            f"{msg.topic} (a half message for {real})" if real and real != msg.topic else msg.topic,
        ),
        ("queue", msg.queue_id),
        ("queue offset", msg.queue_offset),
        ("commit-log offset", msg.commit_log_offset),
        ("message id", msg.msg_id),
        ("born", f"{when(msg.born_timestamp)} from {msg.born_host[0]}:{msg.born_host[1]}"),
        ("stored", f"{when(msg.store_timestamp)} at {msg.store_host[0]}:{msg.store_host[1]}"),
        ("sys flag", msg.sys_flag),
        ("reconsume times", msg.reconsume_times),
        ("body", f"{len(body)} bytes{cut}{'' if printable else ', shown as hex'}"),
    ]
    props = sorted(msg.properties.items())
    return "".join(
        [
            message_form(msg_id, msg.topic),
            kv(pairs, "message"),
            "<h2>Properties</h2>",
            table(["key", "value"], props, css_id="properties", empty="no properties"),
            "<h2>Body</h2>",
            f'<pre id="body">{esc(shown)}</pre>',
        ]
    )


def login(next_url: str, csrf: str, error: str | None) -> str:
    err = str(notice("refused", error)) if error else ""
    return (
        err
        + str(
            notice(
                "info",
                "The broker's ACL is on: sign in with your AccessKey and SecretKey. Pages are "
                "read with the console's account; what you commit, roll back or resume is "
                "signed with yours, so the broker's ACL decides.",
                "about",
            )
        )
        + '<form method="post" action="/login" id="login">'
        f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
        f'<input type="hidden" name="next" value="{esc(next_url)}">'
        '<label for="access_key">AccessKey</label>'
        '<input type="text" id="access_key" name="access_key" autocomplete="username">'
        '<label for="secret_key">SecretKey</label>'
        '<input type="password" id="secret_key" name="secret_key" '
        'autocomplete="current-password">'
        '<p><button type="submit" id="sign-in">sign in</button></p></form>'
    )


def error(text: str) -> str:
    return str(notice("refused", text, "error"))


def user_login(next_url: str, csrf: str, error: str | None) -> str:
    err = str(notice("refused", error)) if error else ""
    return (
        err + '<form method="post" action="/login" id="login">'
        f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
        f'<input type="hidden" name="next" value="{esc(next_url)}">'
        '<label for="username">user</label>'
        '<input type="text" id="username" name="username" autocomplete="username">'
        '<label for="password">password</label>'
        '<input type="password" id="password" name="password" autocomplete="current-password">'
        '<p><button type="submit" id="sign-in">sign in</button></p></form>'
    )


def parse_time(text: str) -> int:
    """Milliseconds since the epoch from ms digits or an ISO time (UTC unless it says)."""
    if text.isdigit():
        return int(text)
    t = datetime.fromisoformat(text)
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return int(t.timestamp() * 1000)


def _msg_rows(msgs: Sequence[MessageExt]) -> list[list[object]]:
    return [
        [
            link(path("messages", id=m.offset_msg_id, topic=m.topic), m.msg_id or m.offset_msg_id),
            m.topic,
            m.queue_id,
            m.queue_offset,
            m.tags or "-",
            m.keys or "-",
            when(m.store_timestamp),
            _preview(m.body),
        ]
        for m in msgs
    ]


def _preview(body: bytes | None, size: int = 60) -> str:
    text = (body or b"")[:size].decode("utf-8", errors="replace")
    return text + ("…" if len(body or b"") > size else "")


def search(topic: str, key: str, found: Sequence[MessageExt] | None) -> str:
    form = (
        '<form method="get" action="/search" id="search-form">'
        '<label for="topic">topic</label>'
        f'<input type="text" id="topic" name="topic" value="{esc(topic)}">'
        '<label for="key">key (a message key, or a message id)</label>'
        f'<input type="text" id="key" name="key" value="{esc(key)}"> '
        '<button type="submit" id="find">find</button></form>'
    )
    if found is None:
        return form
    return form + (
        f"<h2>{len(found)} message(s) of {esc(topic)} with key {esc(key)}</h2>"
        + table(
            ["message id", "topic", "queue", "offset", "tags", "keys", "stored", "body"],
            _msg_rows(found),
            numeric=(2, 3),
            empty="no message with this key",
            css_id="found",
        )
    )


def trace(key: str, rows: list[dict[str, Any]] | None) -> str:
    form = (
        '<form method="get" action="/trace" id="trace-form">'
        '<label for="key">a transaction id, message id or key (the trace topic is read, as '
        "<code>txmq trace</code> does)</label>"
        f'<input type="text" id="key" name="key" value="{esc(key)}"> '
        '<button type="submit" id="show">show</button></form>'
    )
    if rows is None:
        return form
    body = [
        [
            r["time"],
            r["step"],
            r.get("groupName") or "-",
            link(path("messages", id=r["msgId"]), r["msgId"]) if r.get("msgId") else "-",
            r["what"],
        ]
        for r in rows
    ]
    return form + (
        f"<h2>Timeline of {esc(key)}</h2>"
        + table(
            ["time", "step", "group", "message id", "what"],
            body,
            empty="no trace records (is traceTopicEnable on, or do the clients send traces?)",
            css_id="timeline",
        )
    )


def dlq(groups: list[str], group: str, msgs: Sequence[MessageExt] | None, can_act: bool) -> str:
    options = "".join(
        f'<option value="{esc(g)}"{" selected" if g == group else ""}>{esc(g)}</option>'
        for g in groups
    )
    out = [
        '<form method="get" action="/dlq" id="dlq-form">consumer group '
        f'<select name="group" id="group">{options}</select> '
        '<button type="submit" id="list">list</button></form>'
    ]
    if not groups:
        out.append(str(notice("info", "No consumer group has dead-lettered a message.", "none")))
    if msgs is None:
        return "".join(out)
    from txmq.client.dlq import original_topic

    rows = []
    for m in msgs:
        row: list[object] = [
            link(path("messages", id=m.offset_msg_id, topic=m.topic), m.msg_id),
            original_topic(m) or "-",
            m.reconsume_times,
            when(m.store_timestamp),
            _preview(m.body),
        ]
        if can_act:
            row.append(
                Raw(
                    f'<a href="{esc(path("dlq", "confirm", group=group, id=m.msg_id))}">'
                    '<button type="button" class="act resume" '
                    f'id="resend-{esc(m.msg_id)}">Resend…</button></a>'
                )
            )
        rows.append(row)
    headers = ["message id", "original topic", "tries", "stored", "body"]
    out.append(f"<h2>%DLQ%{esc(group)}: {len(msgs)} message(s)</h2>")
    out.append(
        table(
            headers + (["action"] if can_act else []),
            rows,
            numeric=(2,),
            empty="no dead-lettered message",
            css_id="dead",
        )
    )
    if can_act and msgs:
        out.append(
            f'<p><a href="{esc(path("dlq", "confirm", group=group))}">'
            '<button type="button" class="act resume" id="resend-all">Resend all…</button></a></p>'
        )
    return "".join(out)


def dlq_confirm(group: str, msg_id: str, msgs: Sequence[MessageExt], csrf: str) -> str:
    return (
        f"<p>Send {len(msgs)} dead-lettered message(s) of group <b>{esc(group)}</b> back to "
        "their original topics, as new messages with the same body, tags, keys and user "
        "properties? They stay in the dead-letter queue; a repeat within the broker's "
        "duplicate window stores nothing twice.</p>"
        + table(
            ["message id", "original topic", "body"],
            [
                [m.msg_id, m.properties.get(MessageConst.RETRY_TOPIC) or "-", _preview(m.body)]
                for m in msgs
            ],
            css_id="to-resend",
        )
        + '<form method="post" action="/dlq/resend" id="confirm-form">'
        f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
        f'<input type="hidden" name="group" value="{esc(group)}">'
        f'<input type="hidden" name="id" value="{esc(msg_id)}">'
        '<p><button type="submit" class="act resume" id="confirm">Yes, resend</button> '
        f"{link(path('dlq', group=group), 'cancel')}</p></form>"
    )


def dlq_resent(group: str, done: Sequence[Any]) -> str:
    rows = [[r.dlq_msg_id, r.topic, r.msg_id, r.status] for r in done]
    return (
        str(notice("ok", f"{len(done)} message(s) of {group} sent back."))
        + table(["dead-lettered id", "sent to", "new message id", "status"], rows, css_id="resent")
        + f"<p>{link(path('dlq', group=group), 'back to the dead letters')}</p>"
    )


def reset_form(group: str, topics: list[str], topic: str) -> str:
    options = "".join(
        f'<option value="{esc(t)}"{" selected" if t == topic else ""}>{esc(t)}</option>'
        for t in topics
    )
    return (
        f'<form method="get" action="{esc(path("groups", group, "reset"))}" id="reset-form">'
        f'<label for="topic">topic</label><select name="topic" id="topic">{options}</select>'
        "<label>to</label>"
        '<label><input type="radio" name="to" value="earliest" id="to-earliest"> the earliest '
        "message (consume everything again)</label>"
        '<label><input type="radio" name="to" value="latest" id="to-latest" checked> the end '
        "of each queue (skip what is there)</label>"
        '<label><input type="radio" name="to" value="time" id="to-time"> the first message '
        "stored at or after</label>"
        '<input type="text" name="time" id="time" placeholder="2026-01-31 12:00:00 (UTC)">'
        '<p><button type="submit" id="next">next…</button> '
        f"{link(path('groups', group), 'cancel')}</p></form>"
    )


def reset_confirm(
    group: str,
    topic: str,
    what: str,
    query: dict[str, str],
    stats: list[dict[str, Any]],
    csrf: str,
) -> str:
    now = [
        [s["queueId"], s["consumerOffset"], s["brokerOffset"], s["lag"]]
        for s in stats
        if s["topic"] == topic
    ]
    hidden = "".join(
        f'<input type="hidden" name="{k}" value="{esc(query.get(k, ""))}">'
        for k in ("topic", "to", "time")
    )
    return (
        f"<p>Move the committed offsets of group <b>{esc(group)}</b> on topic "
        f"<b>{esc(topic)}</b> to {esc(what)}. Live consumers of the group continue from there "
        "at once.</p><h2>Now</h2>"
        + table(
            ["queue", "committed", "queue end", "lag"], now, numeric=(0, 1, 2, 3), css_id="current"
        )
        + f'<form method="post" action="{esc(path("groups", group, "reset"))}" '
        'id="confirm-form">'
        f'<input type="hidden" name="csrf" value="{esc(csrf)}">{hidden}'
        '<p><button type="submit" class="act rollback" id="confirm">Yes, reset</button> '
        f"{link(path('groups', group), 'cancel')}</p></form>"
    )


def reset_done(group: str, topic: str, what: str, moved: dict[int, int]) -> str:
    return (
        str(notice("ok", f"The offsets of {group} on {topic} were moved to {what}."))
        + table(["queue", "new offset"], sorted(moved.items()), numeric=(0, 1), css_id="moved")
        + f"<p>{link(path('groups', group), 'back to the group')}</p>"
    )


def internal_topic(name: str) -> bool:
    return (
        name in INTERNAL_TOPICS
        or name.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))
        or name == "TBW102"
    )
