"""Fixed cost per request, without sockets: CPU time of the per-frame steps a plain send costs
on both sides (SDK and broker), each in a tight loop.

    python bench/codec.py                 # every step, 50,000 rounds each
    python bench/codec.py --rounds 200000 --only decode

Prints microseconds per call for each step (best of ``--repeats``), so a change to the codec,
the header coercion or the metrics shows up without the noise of a loaded machine's network
path.  The steps:

* ``encode_request``  SDK: SendMessageRequestHeader -> V2 extFields -> frame bytes
* ``decode_request``  broker: frame bytes -> RemotingCommand (FrameDecoder)
* ``header_v2``       broker: V2 extFields -> SendMessageRequestHeader (native msgpack values)
* ``header_strings``  broker: the same header from string values (JSON/ROCKETMQ clients)
* ``encode_response`` broker: SendMessageResponseHeader -> response frame bytes
* ``decode_response`` SDK: response frame bytes -> RemotingCommand -> SendMessageResponseHeader
* ``metrics``         broker: the per-request and per-put counters
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from txmq.broker.metrics import BrokerMetrics
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.command import RemotingCommand
from txmq.protocol.frame import FrameDecoder, encode_frame
from txmq.protocol.headers import SendMessageRequestHeader, SendMessageResponseHeader


def _steps() -> dict[str, Callable[[], object]]:
    header = SendMessageRequestHeader(
        producer_group="bench-group",
        topic="bench-topic",
        queue_id=1,
        born_timestamp=1_700_000_000_000,
        properties="UNIQ_KEY\x01C0A80001000018B4AAC2A3B1E30000\x02WAIT\x01true\x02",
        unit_mode=False,
        batch=False,
    )
    body = b"x" * 1024
    req = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_v2_ext_fields(), body)
    req.opaque = 7
    req_frame = encode_frame(req)
    v2 = req.ext_fields
    strings = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in v2.items()}
    resp_header = SendMessageResponseHeader(
        msg_id="7F00000100002A9F0000000000001234", queue_id=1, queue_offset=12345
    )
    resp = req.response(ResponseCode.SUCCESS, None, resp_header.to_ext_fields())
    resp_frame = encode_frame(resp)
    metrics = BrokerMetrics()
    decoder = FrameDecoder()

    def encode_request() -> object:
        cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_v2_ext_fields(), body)
        return encode_frame(cmd)

    def decode_request() -> object:
        decoder.feed(req_frame)
        return decoder.next_command()

    def header_v2() -> object:
        return SendMessageRequestHeader.from_v2_ext_fields(v2)

    def header_strings() -> object:
        return SendMessageRequestHeader.from_v2_ext_fields(strings)

    def encode_response() -> object:
        return encode_frame(req.response(ResponseCode.SUCCESS, None, resp_header.to_ext_fields()))

    def decode_response() -> object:
        decoder.feed(resp_frame)
        cmd = decoder.next_command()
        assert cmd is not None
        return SendMessageResponseHeader.from_ext_fields(cmd.ext_fields)

    def count_metrics() -> object:
        metrics.record_request(int(RequestCode.SEND_MESSAGE_V2))
        metrics.record_put({"bench-topic": 1}, 1024)
        return None

    return {
        "encode_request": encode_request,
        "decode_request": decode_request,
        "header_v2": header_v2,
        "header_strings": header_strings,
        "encode_response": encode_response,
        "decode_response": decode_response,
        "metrics": count_metrics,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", help="run only the steps whose name contains this")
    args = ap.parse_args()
    total = 0.0
    for name, fn in _steps().items():
        if args.only and args.only not in name:
            continue
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.process_time()
            for _ in range(args.rounds):
                fn()
            best = min(best, time.process_time() - t0)
        us = best / args.rounds * 1e6
        total += us
        print(f"{name:<18} {us:8.2f} us/call")
    print(f"{'total':<18} {total:8.2f} us")


if __name__ == "__main__":
    main()
