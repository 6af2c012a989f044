"""Every fenced block of README.md and docs/*.md runs, or is declared for what it is.

The blocks run as a newcomer would run them, at the addresses the docs name (127.0.0.1:10911,
the cluster's 2079/2179/2279 and 10930-10932): inside a private network and mount namespace, so
nothing else on the machine is in the way, with one broker started as `make run` starts it for
all the single-broker blocks, and docs/cluster.md's quick start in a namespace of its own.  What
runs each block, and why some are not run, is tests/support/docblocks.py's CLAIMS.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from typing import Any

import pytest

from tests.support import docblocks as d

pytestmark = pytest.mark.slow

EVERY = d.blocks()
RUN = [b for b in EVERY if len(d.claim_for(b)) == 1 and d.claim_for(b)[0].kind in d.RUN_KINDS]
#: Bounds of the two runs (each block is bounded by docblocks.BLOCK_TIMEOUT as well).
SINGLE_TIMEOUT = 170.0
CLUSTER_TIMEOUT = 170.0


def test_every_block_is_claimed_once() -> None:
    problems = []
    for block in EVERY:
        claims = d.claim_for(block)
        if not claims:
            problems.append(d.how_to_claim(block))
        elif len(claims) > 1:
            problems.append(f"{block.where}: claimed {len(claims)} times: {claims}")
    assert not problems, "\n".join(problems)


def test_every_claim_names_one_block() -> None:
    stale = [c for c in d.CLAIMS if len(_blocks_of(c)) != 1]
    assert not stale, (
        f"claims naming no block, or several (a claim's `starts` may span lines): {stale}"
    )


def _blocks_of(claim: d.Claim) -> list[d.Block]:
    return [b for b in EVERY if claim in d.claim_for(b)]


def test_what_a_block_is_mapped_to_exists() -> None:
    problems = []
    for claim in d.CLAIMS:
        if claim.kind == "mapped" and not (claim.tests and claim.reason):
            problems.append(f"{claim}: a mapped block names its tests and why it is not run here")
        if claim.kind in ("output", "diagram") and not claim.reason:
            problems.append(f"{claim}: say what the block is")
        for prefix, target in claim.mapped.items():
            if target == "Makefile":
                recipe = d.make_recipe(prefix.split()[1])  # `make run` -> the run recipe
                if "txmq broker" not in recipe:
                    problems.append(f"`{prefix}` no longer starts a broker: {recipe}")
                continue
            if target == d.FRESH_CLONE:
                text = (d.ROOT / target).read_text()
                if "make test" not in text:
                    problems.append(f"{target} does not run `make test`")
                if prefix.startswith("pip install -e") and "spark," not in d.make_install():
                    problems.append("`make test` no longer installs the checkout with the extras")
                continue
            why = d.mapped_target_exists(target)
            if why:
                problems.append(f"{claim.path} `{prefix}`: {why}")
        for target in claim.tests:
            why = d.mapped_target_exists(target)
            if why:
                problems.append(f"{claim.path} {claim.starts!r}: {why}")
    assert not problems, "\n".join(problems)


def test_every_shell_line_is_run_or_mapped() -> None:
    problems = []
    for block in EVERY:
        claims = d.claim_for(block)
        if len(claims) != 1 or claims[0].kind != "shell":
            continue
        for line in d.logical_lines(block.text):
            code = d.code_of(line)
            mapped = any(code.startswith(p) for p in claims[0].mapped)
            if not mapped and not re.search(r"(^|\s|/)txmq(\s|$)", code):
                problems.append(f"{block.where}: `{code}` is neither run nor mapped to a test")
    assert not problems, "\n".join(problems)


def test_folder_listings_name_what_exists() -> None:
    missing, named = [], 0
    for block in EVERY:
        if [c.kind for c in d.claim_for(block)] == ["tree"]:
            for path in d.tree_paths(block.text):
                named += 1
                if not (d.ROOT / path).exists():
                    missing.append(f"{block.where}: {path} does not exist")
    assert named >= 10 and not missing, "\n".join(missing)


def test_every_python_block_compiles() -> None:
    """Also those that are not run here (the Spark ones): no `...` placeholders in code."""
    problems = []
    for block in EVERY:
        if block.lang == "python":
            try:
                compile(block.text, block.where, "exec")
            except SyntaxError as exc:
                problems.append(f"{block.where}: {exc}")
    assert not problems, "\n".join(problems)


def test_the_readme_commands_are_run() -> None:
    readme = [b for b in RUN if b.path == "README.md"]
    lines = [ln for b in readme if b.lang == "bash" for ln in d.logical_lines(b.text)]
    assert any(ln.startswith(".venv/bin/txmq send") for ln in lines), lines
    assert any("txmq txn commit <transactionId>" in ln for ln in lines), lines
    assert sum("txmq" in ln for ln in lines) >= 15, lines
    assert sum(b.lang == "python" for b in readme) >= 3


def _in_namespace(mode: str, timeout: float, *args: str) -> dict[str, Any]:
    if os.geteuid() != 0:
        pytest.skip("needs root for a private network namespace (unshare --net)")
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare(1) and ip(8) for a private network namespace")
    argv = ["unshare", "--net", "--mount", "--propagation", "private", "--"]
    probe = subprocess.run([*argv, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a private network namespace here: {probe.stderr.strip()}")
    argv += [sys.executable, "-m", "tests.support.docblocks", mode, *args]
    env = dict(os.environ, PYTHONPATH=str(d.ROOT))
    p = subprocess.Popen(
        argv,
        cwd=d.ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)  # the runner stops what it started
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
        pytest.fail(f"the {mode} run took over {timeout:.0f} s:\n{out[-4000:]}\n{err[-4000:]}")
    lines = [ln for ln in out.splitlines() if ln.startswith(d.RESULT_MARK)]
    assert lines, f"the {mode} run reported nothing (exit {p.returncode}):\n{out}\n{err[-4000:]}"
    results: dict[str, Any] = json.loads(lines[-1][len(d.RESULT_MARK) :])
    runner = results.get("runner")
    assert runner is None, f"the {mode} run failed:\n{runner['detail']}\n{err[-4000:]}"
    return results


_RESULTS: dict[str, dict[str, Any]] = {}


def _results_of(run: str) -> dict[str, Any]:
    """The results of one of docblocks.RUNS, run at the first test that needs them (in its call
    phase, so each run has a phase's time to itself)."""
    if run not in _RESULTS:
        # a run that failed is not started again by the next test of the run
        _RESULTS[run] = {"runner": f"the {run} run failed: see the first test of that run"}
        _RESULTS[run] = _in_namespace("single", SINGLE_TIMEOUT, run)
    assert "runner" not in _RESULTS[run], _RESULTS[run]["runner"]
    return _RESULTS[run]


@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_block_runs(block: d.Block) -> None:
    result = _results_of(d.run_of(block.path)).get(block.where)
    assert result is not None, f"{block.where} was not run"
    assert result["ok"], f"{block.where} failed:\n{result['detail']}"


def test_cluster_quick_start_runs_as_written_and_shows_a_leader() -> None:
    results = _in_namespace("cluster", CLUSTER_TIMEOUT)
    assert len(results) == 2, results
    for where, result in results.items():
        assert result["ok"], f"{where} failed:\n{result['detail']}"
