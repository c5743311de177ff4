"""python-etcd3 (Debian's python3-etcd3) against a running metcd.

Usage: /usr/bin/python3 kv_etcd3.py HOST PORT
Exits non-zero with a message on the first mismatch. Covers what the KV
API offers a python user today: put/get/delete, prefixes, transactions,
replace, and bad input (malformed protobuf, oversized request) answered
with errors while the server keeps serving.
"""
import sys

import etcd3
import grpc


def check(cond, what):
    if not cond:
        raise SystemExit("FAILED: " + what)


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    c = etcd3.client(host=host, port=port, timeout=10)

    c.put("/py/a", "1")
    value, meta = c.get("/py/a")
    check(value == b"1", "get after put: %r" % value)
    check(meta.version == 1 and meta.create_revision == meta.mod_revision, "metadata of a new key")
    c.put("/py/a", "2")
    value, meta = c.get("/py/a")
    check(value == b"2" and meta.version == 2, "overwrite bumps version")

    for i in range(5):
        c.put("/py/dir/k%d" % i, "v%d" % i)
    got = sorted((m.key, v) for v, m in c.get_prefix("/py/dir/"))
    check(got == [(b"/py/dir/k%d" % i, b"v%d" % i) for i in range(5)], "get_prefix: %r" % got)
    desc = [m.key for _, m in c.get_prefix("/py/dir/", sort_order="descend")]
    check(desc[0] == b"/py/dir/k4", "descending prefix: %r" % desc)

    # Transactions: the Kubernetes create pattern and a compare-and-swap.
    ok, _ = c.transaction(
        compare=[c.transactions.create("/py/new") == 0],
        success=[c.transactions.put("/py/new", "created")],
        failure=[],
    )
    check(ok, "create-if-absent succeeds the first time")
    ok, _ = c.transaction(
        compare=[c.transactions.create("/py/new") == 0],
        success=[c.transactions.put("/py/new", "again")],
        failure=[c.transactions.get("/py/new")],
    )
    check(not ok, "create-if-absent fails the second time")
    ok, responses = c.transaction(
        compare=[c.transactions.value("/py/a") == "2"],
        success=[c.transactions.put("/py/a", "3"), c.transactions.get("/py/a")],
        failure=[],
    )
    check(ok, "value compare")
    check(responses[1][0][0] == b"3", "read inside txn sees its own write: %r" % (responses[1],))
    check(c.replace("/py/a", "3", "4"), "replace with the right old value")
    check(not c.replace("/py/a", "3", "5"), "replace with a stale old value")
    check(c.get("/py/a")[0] == b"4", "replace result")

    check(c.delete("/py/a"), "delete an existing key")
    check(not c.delete("/py/a"), "delete a missing key")
    check(c.get("/py/a")[0] is None, "deleted key is gone")
    c.delete_prefix("/py/dir/")
    check(list(c.get_prefix("/py/dir/")) == [], "delete_prefix")

    # Bad input: bytes that are not a PutRequest, on a raw gRPC call.
    channel = grpc.insecure_channel("%s:%d" % (host, port))
    raw_put = channel.unary_unary(
        "/etcdserverpb.KV/Put",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    try:
        raw_put(b"\x0a\xff\xff\xff\xff\x0f", timeout=5)
        raise SystemExit("FAILED: malformed protobuf was accepted")
    except grpc.RpcError as e:
        check(e.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT),
              "malformed protobuf code: %s" % e.code())
    # An unknown method is Unimplemented, as in etcd.
    unknown = channel.unary_unary("/etcdserverpb.KV/NoSuchMethod",
                                  request_serializer=lambda b: b, response_deserializer=lambda b: b)
    try:
        unknown(b"", timeout=5)
        raise SystemExit("FAILED: unknown method answered")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNIMPLEMENTED, "unknown method code: %s" % e.code())

    # Oversized: over --max-request-bytes (1.5 MiB) but under the gRPC
    # message limit: etcd's own error, and nothing written.
    try:
        c.put("/py/big", b"x" * (1536 * 1024 + 1000))
        raise SystemExit("FAILED: oversized put accepted")
    except etcd3.exceptions.Etcd3Exception as e:
        check("request is too large" in str(e.args) or "request is too large" in repr(e), repr(e))
    except grpc.RpcError as e:
        check("request is too large" in e.details(), e.details())
    check(c.get("/py/big")[0] is None, "oversized put left nothing behind")

    kubernetes_patterns(c)

    # Still serving.
    c.put("/py/after", "ok")
    check(c.get("/py/after")[0] == b"ok", "server still serves after bad input")
    print("python etcd3: all checks passed")


def kubernetes_patterns(c):
    """The storage patterns of Kubernetes' apiserver (seed 001): create as
    Txn(mod_revision == 0), update as Txn(mod_revision == x), and a
    paginated list at a fixed revision."""
    from etcd3 import etcdrpc

    kv = c.kvstub

    def guarded_put(key, value, mod_revision):
        return kv.Txn(etcdrpc.TxnRequest(
            compare=[etcdrpc.Compare(key=key, target=etcdrpc.Compare.MOD,
                                     result=etcdrpc.Compare.EQUAL, mod_revision=mod_revision)],
            success=[etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=value))],
            failure=[etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=key))],
        ), timeout=5)

    pod = b"/registry/pods/default/web-0"
    r = guarded_put(pod, b"v1", 0)
    check(r.succeeded, "create as Txn(mod_revision == 0)")
    created_rev = r.header.revision
    r = guarded_put(pod, b"dup", 0)
    check(not r.succeeded, "second create conflicts")
    current = r.responses[0].response_range.kvs[0]
    check(current.value == b"v1" and current.mod_revision == created_rev, "conflict returns the current object")
    r = guarded_put(pod, b"v2", created_rev)
    check(r.succeeded and r.header.revision == created_rev + 1, "update as Txn(mod_revision == x)")
    r = guarded_put(pod, b"v3", created_rev)
    check(not r.succeeded, "stale update conflicts")

    for i in range(10):
        kv.Put(etcdrpc.PutRequest(key=b"/registry/cm/ns/c%02d" % i, value=b"%d" % i), timeout=5)
    prefix, end = b"/registry/cm/", b"/registry/cm0"
    first = kv.Range(etcdrpc.RangeRequest(key=prefix, range_end=end, limit=3), timeout=5)
    list_rev = first.header.revision
    check(first.more and first.count == 10 and len(first.kvs) == 3, "first page")
    # Writes after the list revision must not show up in later pages.
    kv.Put(etcdrpc.PutRequest(key=b"/registry/cm/ns/c05", value=b"changed"), timeout=5)
    kv.Put(etcdrpc.PutRequest(key=b"/registry/cm/ns/c99", value=b"new"), timeout=5)
    seen = [kv_.key for kv_ in first.kvs]
    values = {kv_.key: kv_.value for kv_ in first.kvs}
    page = first
    while page.more:
        start = page.kvs[-1].key + b"\0"
        page = kv.Range(etcdrpc.RangeRequest(key=start, range_end=end, limit=3, revision=list_rev), timeout=5)
        check(page.header.revision > list_rev, "pages report the current revision in their header")
        seen += [kv_.key for kv_ in page.kvs]
        values.update({kv_.key: kv_.value for kv_ in page.kvs})
    check(seen == [b"/registry/cm/ns/c%02d" % i for i in range(10)], "pages at a fixed revision: %r" % seen)
    check(values[b"/registry/cm/ns/c05"] == b"5", "a page shows the value at the list revision")


if __name__ == "__main__":
    main()
