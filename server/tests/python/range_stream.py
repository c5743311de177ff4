"""metcd's RangeStream (etcd 3.7's design; not in etcd 3.4, so metcd only).

Usage: /usr/bin/python3 range_stream.py HOST PORT
"""
import sys

import etcd3
import grpc
from etcd3 import etcdrpc


def check(cond, what):
    if not cond:
        raise SystemExit("FAILED: " + what)


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    c = etcd3.client(host=host, port=port, timeout=30)
    for i in range(2500):
        c.put("/big/%05d" % i, "v%d" % i)
    channel = grpc.insecure_channel("%s:%d" % (host, port))
    stream = channel.unary_stream(
        "/etcdserverpb.KV/RangeStream",
        request_serializer=etcdrpc.RangeRequest.SerializeToString,
        response_deserializer=etcdrpc.RangeResponse.FromString,
    )
    chunks = []
    for resp in stream(etcdrpc.RangeRequest(key=b"/big/", range_end=b"/big0"), timeout=30):
        chunks.append(resp)
        if len(chunks) == 1:
            # Written after the stream's revision: must not show up.
            c.put("/big/99999", "late")
            c.delete("/big/00000")
    sizes = [len(r.kvs) for r in chunks]
    check(sizes == [1000, 1000, 500], "chunk sizes %r" % sizes)
    check([r.more for r in chunks] == [True, True, False], "more flags")
    check(all(r.count == 2500 for r in chunks), "count in every chunk")
    revs = {r.header.revision for r in chunks}
    check(len(revs) == 1, "one revision for the whole stream: %r" % revs)
    keys = [kv.key for r in chunks for kv in r.kvs]
    check(keys == [b"/big/%05d" % i for i in range(2500)], "every key once, in order, at the stream's revision")

    limited = list(stream(etcdrpc.RangeRequest(key=b"/big/", range_end=b"/big0", limit=1500), timeout=30))
    check([len(r.kvs) for r in limited] == [1000, 500], "limit honoured: %r" % [len(r.kvs) for r in limited])
    check(limited[-1].more, "more is true when the limit cut the range")
    try:
        list(stream(etcdrpc.RangeRequest(key=b"/big/", range_end=b"/big0",
                                         sort_order=etcdrpc.RangeRequest.DESCEND), timeout=30))
        raise SystemExit("FAILED: descending RangeStream accepted")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, "descending: %s" % e.code())
    print("RangeStream: all checks passed")


if __name__ == "__main__":
    main()
