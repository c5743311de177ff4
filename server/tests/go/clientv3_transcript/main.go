// Command clientv3_transcript drives one etcd endpoint through Go clientv3
// 3.4 (Debian's golang-etcd-server-dev sources, built in GOPATH mode) and
// prints a transcript of what the client saw: values, revisions, counts,
// events and error strings. The test runs it against a fresh real etcd 3.4
// and a fresh metcd and compares the transcripts line by line, so every
// line must depend only on what etcd's API promises: IDs (member, cluster,
// lease), versions, sizes and clocks are masked or left out.
//
// Usage: clientv3_transcript HOST:PORT (one fresh member), or
// clientv3_transcript cluster HOST:PORT... (a fresh cluster, one client
// URL per member, members named n1, n2, ...).
// Exit status 1 (with a "FAIL:" line) when a step does not finish in time
// or an invariant the transcript cannot show is broken.
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
	"go.etcd.io/etcd/clientv3/leasing"
	"go.etcd.io/etcd/clientv3/mirror"
	"go.etcd.io/etcd/clientv3/namespace"
	"go.etcd.io/etcd/etcdserver/api/v3rpc/rpctypes"
	"go.etcd.io/etcd/mvcc/mvccpb"
)

// step bounds every call: a server that never answers fails the run
// instead of hanging the test.
const step = 10 * time.Second

var endpoint string

func main() {
	if len(os.Args) >= 3 && os.Args[1] == "cluster" {
		clusterMain(os.Args[2:])
		return
	}
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: clientv3_transcript HOST:PORT | cluster HOST:PORT...")
		os.Exit(2)
	}
	endpoint = os.Args[1]
	cli := connect("", "")
	defer cli.Close()

	kv(cli)
	txn(cli)
	hash(cli)
	kubernetesPatterns(cli)
	compaction(cli)
	watch(cli)
	lease(cli)
	locksElectionsAndSTM(cli)
	moreKVAndWatch(cli)
	clientSideWrappers(cli)
	cluster(cli)
	maintenance(cli)
	auth(cli)
	fmt.Println("done")
}

func connect(user, password string) *clientv3.Client {
	return connectTo([]string{endpoint}, user, password)
}

func connectTo(endpoints []string, user, password string) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: step,
		Username:    user,
		Password:    password,
	})
	if err != nil {
		fail("connect as %q: %v", user, err)
	}
	return cli
}

func ctx() context.Context {
	c, _ := context.WithTimeout(context.Background(), step) //nolint:govet
	return c
}

func fail(format string, args ...interface{}) {
	fmt.Printf("FAIL: "+format+"\n", args...)
	os.Exit(1)
}

func section(name string) { fmt.Printf("== %s\n", name) }

func say(format string, args ...interface{}) { fmt.Printf(format+"\n", args...) }

// errText is what a Go program would log for err ("ok" when nil), with
// the gRPC code when clientv3 recognised the error as one of etcd's (its
// rpctypes.EtcdError keeps the code the server sent).
func errText(err error) string {
	if err == nil {
		return "ok"
	}
	if ev, ok := err.(rpctypes.EtcdError); ok {
		return fmt.Sprintf("error: %s (%s)", ev.Error(), ev.Code())
	}
	return "error: " + err.Error()
}

func kvText(kv *mvccpb.KeyValue) string {
	lease := ""
	if kv.Lease != 0 {
		lease = " lease"
	}
	return fmt.Sprintf("%s=%q c%d m%d v%d%s", kv.Key, kv.Value, kv.CreateRevision,
		kv.ModRevision, kv.Version, lease)
}

func getText(r *clientv3.GetResponse) string {
	parts := []string{fmt.Sprintf("rev %d count %d more %v", r.Header.Revision, r.Count, r.More)}
	for _, kv := range r.Kvs {
		parts = append(parts, kvText(kv))
	}
	return strings.Join(parts, " | ")
}

func get(cli clientv3.KV, what, key string, opts ...clientv3.OpOption) {
	r, err := cli.Get(ctx(), key, opts...)
	if err != nil {
		say("get %s: %s", what, errText(err))
		return
	}
	say("get %s: %s", what, getText(r))
}

func put(cli clientv3.KV, key, value string, opts ...clientv3.OpOption) *clientv3.PutResponse {
	r, err := cli.Put(ctx(), key, value, opts...)
	if err != nil {
		say("put %s: %s", key, errText(err))
		return nil
	}
	prev := ""
	if r.PrevKv != nil {
		prev = " prev " + kvText(r.PrevKv)
	}
	say("put %s: rev %d%s", key, r.Header.Revision, prev)
	return r
}

func kv(cli *clientv3.Client) {
	section("kv")
	for _, k := range []string{"a", "b", "c/1", "c/2", "c/3", "d"} {
		put(cli, k, "value of "+k)
	}
	put(cli, "a", "second", clientv3.WithPrevKV())
	put(cli, "b", "", clientv3.WithIgnoreValue(), clientv3.WithPrevKV())
	put(cli, "missing", "", clientv3.WithIgnoreValue())
	put(cli, "", "empty key")
	put(cli, "big", strings.Repeat("x", 1600*1024))
	get(cli, "a", "a")
	get(cli, "a at rev 2", "a", clientv3.WithRev(2))
	get(cli, "a at a future rev", "a", clientv3.WithRev(1000))
	get(cli, "prefix c/", "c/", clientv3.WithPrefix())
	get(cli, "prefix c/ limit 2", "c/", clientv3.WithPrefix(), clientv3.WithLimit(2))
	get(cli, "prefix c/ descending", "c/", clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
	get(cli, "all by mod rev", "", clientv3.WithFromKey(),
		clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend))
	get(cli, "all by value desc", "", clientv3.WithFromKey(),
		clientv3.WithSort(clientv3.SortByValue, clientv3.SortDescend))
	get(cli, "count only", "", clientv3.WithFromKey(), clientv3.WithCountOnly())
	get(cli, "keys only", "c/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	get(cli, "range [b, c/2)", "b", clientv3.WithRange("c/2"))
	get(cli, "from key c/2", "c/2", clientv3.WithFromKey())
	get(cli, "min mod rev 4", "", clientv3.WithFromKey(), clientv3.WithMinModRev(4))
	get(cli, "max create rev 3", "", clientv3.WithFromKey(), clientv3.WithMaxCreateRev(3))
	get(cli, "serializable", "a", clientv3.WithSerializable())
	r, err := cli.Delete(ctx(), "c/", clientv3.WithPrefix(), clientv3.WithPrevKV())
	if err != nil {
		say("delete c/: %s", errText(err))
	} else {
		prevs := []string{}
		for _, kv := range r.PrevKvs {
			prevs = append(prevs, kvText(kv))
		}
		say("delete c/: rev %d deleted %d prev %s", r.Header.Revision, r.Deleted,
			strings.Join(prevs, ", "))
	}
	r, err = cli.Delete(ctx(), "nothing")
	if err == nil {
		say("delete nothing: rev %d deleted %d", r.Header.Revision, r.Deleted)
	} else {
		say("delete nothing: %s", errText(err))
	}
	get(cli, "deleted key at its last rev", "c/1", clientv3.WithRev(3))
}

func txnText(r *clientv3.TxnResponse, err error) string {
	if err != nil {
		return errText(err)
	}
	parts := []string{fmt.Sprintf("succeeded %v rev %d", r.Succeeded, r.Header.Revision)}
	for _, op := range r.Responses {
		switch {
		case op.GetResponseRange() != nil:
			g := (*clientv3.GetResponse)(op.GetResponseRange())
			parts = append(parts, "range["+getText(g)+"]")
		case op.GetResponsePut() != nil:
			parts = append(parts, fmt.Sprintf("put[rev %d]", op.GetResponsePut().Header.Revision))
		case op.GetResponseDeleteRange() != nil:
			parts = append(parts, fmt.Sprintf("delete[%d]", op.GetResponseDeleteRange().Deleted))
		case op.GetResponseTxn() != nil:
			t := (*clientv3.TxnResponse)(op.GetResponseTxn())
			parts = append(parts, "txn["+txnText(t, nil)+"]")
		}
	}
	return strings.Join(parts, " ")
}

func txn(cli *clientv3.Client) {
	section("txn")
	create := func() string {
		r, err := cli.Txn(ctx()).
			If(clientv3.Compare(clientv3.ModRevision("t/k"), "=", 0)).
			Then(clientv3.OpPut("t/k", "created")).
			Else(clientv3.OpGet("t/k")).
			Commit()
		return txnText(r, err)
	}
	say("create t/k: %s", create())
	say("create t/k again: %s", create())
	r, err := cli.Txn(ctx()).
		If(clientv3.Compare(clientv3.Value("t/k"), "=", "created"),
			clientv3.Compare(clientv3.Version("t/k"), "=", 1),
			clientv3.Compare(clientv3.CreateRevision("t/k"), ">", 0)).
		Then(clientv3.OpPut("t/k", "updated"), clientv3.OpPut("t/other", "o"),
			clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.Value("t/other"), "=", "o")},
				[]clientv3.Op{clientv3.OpGet("t/", clientv3.WithPrefix())},
				[]clientv3.Op{clientv3.OpDelete("t/third")})).
		Commit()
	say("compare and update: %s", txnText(r, err))
	r, err = cli.Txn(ctx()).
		Then(clientv3.OpPut("t/other", "o2"),
			clientv3.OpTxn(nil, nil, []clientv3.Op{clientv3.OpDelete("t/other")})).
		Commit()
	say("put and a nested delete of one key: %s", txnText(r, err))
	r, err = cli.Txn(ctx()).
		If(clientv3.Compare(clientv3.Value("t/k"), "<", "a")).
		Then(clientv3.OpPut("t/k", "never")).
		Else(clientv3.OpDelete("t/", clientv3.WithPrefix(), clientv3.WithPrevKV()),
			clientv3.OpGet("t/", clientv3.WithPrefix(), clientv3.WithCountOnly())).
		Commit()
	say("else branch: %s", txnText(r, err))
	r, err = cli.Txn(ctx()).Then(clientv3.OpPut("t/dup", "1"), clientv3.OpPut("t/dup", "2")).Commit()
	say("duplicate put: %s", txnText(r, err))
	many := make([]clientv3.Op, 129)
	for i := range many {
		many[i] = clientv3.OpPut(fmt.Sprintf("t/many/%03d", i), "x")
	}
	r, err = cli.Txn(ctx()).Then(many...).Commit()
	say("129 ops: %s", txnText(r, err))
	r, err = cli.Txn(ctx()).Then(many[:128]...).Commit()
	say("128 ops: %s", txnText(r, err))
	r, err = cli.Txn(ctx()).
		If(clientv3.Compare(clientv3.ModRevision("t/many/"), "<", 1000).WithPrefix()).
		Then(clientv3.OpDelete("t/many/", clientv3.WithPrefix())).
		Commit()
	say("prefix compare and delete: %s", txnText(r, err))
}

// kubernetesPatterns does what the Kubernetes API server's etcd3 store
// does: create-if-absent with a lease, a guarded update from a read's mod
// revision (GuaranteedUpdate), paginated lists at one revision, and a
// watch from the list's revision with previous values.
func kubernetesPatterns(cli *clientv3.Client) {
	section("kubernetes storage patterns")
	lease, err := cli.Grant(ctx(), 60)
	if err != nil {
		fail("grant: %v", err)
	}
	for i := 0; i < 5; i++ {
		key := fmt.Sprintf("/registry/pods/default/pod-%d", i)
		r, err := cli.Txn(ctx()).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, fmt.Sprintf("spec-%d", i), clientv3.WithLease(lease.ID))).
			Commit()
		say("create %s: %s", key, txnText(r, err))
	}
	key := "/registry/pods/default/pod-0"
	g, err := cli.Get(ctx(), key)
	if err != nil || len(g.Kvs) != 1 {
		fail("read %s: %v", key, err)
	}
	orig := g.Kvs[0].ModRevision
	for _, attempt := range []string{"first", "stale"} {
		r, err := cli.Txn(ctx()).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", orig)).
			Then(clientv3.OpPut(key, "spec-0-"+attempt, clientv3.WithLease(lease.ID))).
			Else(clientv3.OpGet(key)).
			Commit()
		say("guaranteed update (%s): %s", attempt, txnText(r, err))
	}
	prefix := "/registry/pods/"
	end := clientv3.GetPrefixRangeEnd(prefix)
	listRev := int64(0)
	from := prefix
	for page := 1; ; page++ {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(2)}
		if listRev != 0 {
			opts = append(opts, clientv3.WithRev(listRev))
		}
		r, err := cli.Get(ctx(), from, opts...)
		if err != nil {
			fail("list page %d: %v", page, err)
		}
		if listRev == 0 {
			listRev = r.Header.Revision
		}
		say("list page %d: %s", page, getText(r))
		if !r.More {
			break
		}
		from = string(r.Kvs[len(r.Kvs)-1].Key) + "\x00"
	}
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := cli.Watch(clientv3.WithRequireLeader(wctx), prefix, clientv3.WithPrefix(),
		clientv3.WithRev(listRev+1), clientv3.WithPrevKV(), clientv3.WithProgressNotify(),
		clientv3.WithCreatedNotify())
	created := next(w, "watch created")
	say("watch created: created %v events %d", created.Created, len(created.Events))
	put(cli, "/registry/pods/default/pod-1", "spec-1-b", clientv3.WithLease(lease.ID))
	if _, err := cli.Delete(ctx(), "/registry/pods/default/pod-2"); err != nil {
		fail("delete pod-2: %v", err)
	}
	events(w, 2)
	if err := cli.RequestProgress(clientv3.WithRequireLeader(wctx)); err != nil {
		fail("request progress: %v", err)
	}
	p := next(w, "progress")
	say("progress: notify %v events %d rev %d", p.IsProgressNotify(), len(p.Events), p.Header.Revision)
	if _, err := cli.Revoke(ctx(), lease.ID); err != nil {
		fail("revoke: %v", err)
	}
	events(w, 4)
}

// pending holds events a watch delivered beyond what the last events()
// call asked for (a response may carry several).
var pending = map[clientv3.WatchChan][]*clientv3.Event{}

// events prints and returns the next n events of w (bounded).
func events(w clientv3.WatchChan, n int) []*clientv3.Event {
	for len(pending[w]) < n {
		r := next(w, fmt.Sprintf("%d events", n))
		if r.Canceled {
			fail("watch cancelled: %v", r.Err())
		}
		pending[w] = append(pending[w], r.Events...)
	}
	got := pending[w][:n]
	pending[w] = pending[w][n:]
	for _, e := range got {
		prev := ""
		if e.PrevKv != nil {
			prev = " prev " + kvText(e.PrevKv)
		}
		say("event %s %s%s", e.Type, kvText(e.Kv), prev)
	}
	return got
}

func next(w clientv3.WatchChan, what string) clientv3.WatchResponse {
	select {
	case r, ok := <-w:
		if !ok {
			fail("watch channel closed waiting for %s", what)
		}
		return r
	case <-time.After(step):
		fail("no watch response in %v waiting for %s", step, what)
	}
	panic("unreachable")
}

// hash prints HashKV at the current revision. It runs before any key is
// written with a lease: lease IDs differ between servers and are hashed.
func hash(cli *clientv3.Client) {
	section("hashkv")
	h, err := cli.HashKV(ctx(), endpoint, 0)
	if err != nil {
		say("hashkv: %s", errText(err))
		return
	}
	say("hashkv: hash %d compact revision %d rev %d", h.Hash, h.CompactRevision, h.Header.Revision)
}

func compaction(cli *clientv3.Client) {
	section("compaction")
	put(cli, "comp", "1")
	put(cli, "comp", "2")
	r := put(cli, "comp", "3")
	if r == nil {
		fail("put comp")
	}
	rev := r.Header.Revision
	_, err := cli.Compact(ctx(), rev-1, clientv3.WithCompactPhysical())
	say("compact at %d: %s", rev-1, errText(err))
	_, err = cli.Compact(ctx(), rev-1)
	say("compact at %d again: %s", rev-1, errText(err))
	_, err = cli.Compact(ctx(), rev+100)
	say("compact at a future revision: %s", errText(err))
	get(cli, "comp before the compaction", "comp", clientv3.WithRev(rev-2))
	get(cli, "comp at the compaction", "comp", clientv3.WithRev(rev-1))
	h, err := cli.HashKV(ctx(), endpoint, rev-2)
	if err != nil {
		say("hashkv below the compaction: %s", errText(err))
	} else {
		say("hashkv below the compaction: compact revision %d", h.CompactRevision)
	}
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := cli.Watch(wctx, "comp", clientv3.WithRev(rev-2))
	resp := next(w, "compacted watch")
	say("watch from a compacted revision: canceled %v compact revision %d err %s",
		resp.Canceled, resp.CompactRevision, errText(resp.Err()))
}

func watch(cli *clientv3.Client) {
	section("watch")
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := cli.Watch(wctx, "w/", clientv3.WithPrefix(), clientv3.WithPrevKV(),
		clientv3.WithCreatedNotify())
	c := next(w, "created")
	say("created: %v", c.Created)
	first := put(cli, "w/1", "a")
	put(cli, "w/1", "b")
	put(cli, "w/2", "c")
	if _, err := cli.Delete(ctx(), "w/1"); err != nil {
		fail("delete w/1: %v", err)
	}
	events(w, 4)
	// A second watcher replays the same history from a revision.
	replay := cli.Watch(wctx, "w/", clientv3.WithPrefix(), clientv3.WithRev(first.Header.Revision),
		clientv3.WithFilterPut())
	say("replay, deletes only:")
	events(replay, 1)
	// Key range and filter.
	ranged := cli.Watch(wctx, "w/2", clientv3.WithRange("w/4"), clientv3.WithFilterDelete(),
		clientv3.WithCreatedNotify())
	next(ranged, "created")
	put(cli, "w/3", "d")
	put(cli, "w/5", "outside")
	if _, err := cli.Delete(ctx(), "w/3"); err != nil {
		fail("delete w/3: %v", err)
	}
	put(cli, "w/2", "e")
	say("range [w/2, w/4), puts only:")
	events(ranged, 2)
	say("prefix watcher:")
	events(w, 4)
}

func lease(cli *clientv3.Client) {
	section("lease")
	g, err := cli.Grant(ctx(), 30)
	if err != nil {
		fail("grant: %v", err)
	}
	say("grant: ttl %d error %q", g.TTL, g.Error)
	put(cli, "l/a", "1", clientv3.WithLease(g.ID))
	put(cli, "l/b", "2", clientv3.WithLease(g.ID))
	ttl, err := cli.TimeToLive(ctx(), g.ID, clientv3.WithAttachedKeys())
	if err != nil {
		fail("timetolive: %v", err)
	}
	keys := []string{}
	for _, k := range ttl.Keys {
		keys = append(keys, string(k))
	}
	sort.Strings(keys)
	say("timetolive: granted %d remaining in (0, 30]: %v keys %v", ttl.GrantedTTL,
		ttl.TTL > 0 && ttl.TTL <= 30, keys)
	ka, err := cli.KeepAliveOnce(ctx(), g.ID)
	say("keepalive once: %s ttl %d", errText(err), ttlOf(ka))
	leases, err := cli.Leases(ctx())
	if err != nil {
		fail("leases: %v", err)
	}
	listed := false
	for _, l := range leases.Leases {
		listed = listed || l.ID == g.ID
	}
	say("leases lists the grant: %v", listed)
	_, err = cli.Revoke(ctx(), g.ID)
	say("revoke: %s", errText(err))
	get(cli, "l/ after revoke", "l/", clientv3.WithPrefix())
	ttl, err = cli.TimeToLive(ctx(), g.ID)
	if err == nil {
		say("timetolive after revoke: ttl %d", ttl.TTL)
	} else {
		say("timetolive after revoke: %s", errText(err))
	}
	_, err = cli.KeepAliveOnce(ctx(), g.ID)
	say("keepalive once after revoke: %s", errText(err))
	_, err = cli.Revoke(ctx(), g.ID)
	say("revoke again: %s", errText(err))
	put(cli, "l/c", "3", clientv3.WithLease(g.ID))
	g2, err := cli.Grant(ctx(), 0)
	say("grant ttl 0: %s", errText(err))
	if err == nil {
		say("grant ttl 0: ttl %d", g2.TTL)
	}
	_, err = cli.Grant(ctx(), 9000000001)
	say("grant ttl 9000000001: %s", errText(err))

	// A kept-alive lease outlives its TTL; a lapsed one takes its keys.
	short, err := cli.Grant(ctx(), 2)
	if err != nil {
		fail("grant 2: %v", err)
	}
	kept, err := cli.Grant(ctx(), 2)
	if err != nil {
		fail("grant 2: %v", err)
	}
	put(cli, "l/short", "s", clientv3.WithLease(short.ID))
	written := put(cli, "l/kept", "k", clientv3.WithLease(kept.ID))
	if written == nil {
		fail("put l/kept")
	}
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := cli.Watch(wctx, "l/", clientv3.WithPrefix(), clientv3.WithRev(written.Header.Revision+1))
	kc, err := cli.KeepAlive(wctx, kept.ID)
	if err != nil {
		fail("keepalive: %v", err)
	}
	go func() {
		for range kc {
		}
	}()
	say("expiry:")
	events(w, 1)
	time.Sleep(3 * time.Second)
	get(cli, "l/kept after 3 s of keepalive", "l/kept", clientv3.WithKeysOnly())
	// Revoked now, not left to expire at some point of a later section.
	_, err = cli.Revoke(ctx(), kept.ID)
	say("revoke the kept lease: %s", errText(err))
}

// moreKVAndWatch covers what the sections above leave out: lease
// compares and ignore-lease puts, a keep-alive channel of a revoked lease,
// a watch that starts at a future revision, many watches on one stream
// and their cancellation, fragments, and whole-keyspace operations.
func moreKVAndWatch(cli *clientv3.Client) {
	section("more kv and watch")
	g, err := cli.Grant(ctx(), 60)
	if err != nil {
		fail("grant: %v", err)
	}
	put(cli, "x/leased", "1", clientv3.WithLease(g.ID))
	put(cli, "x/leased", "2", clientv3.WithIgnoreLease())
	put(cli, "x/plain", "p")
	r, err := cli.Txn(ctx()).
		If(clientv3.Compare(clientv3.LeaseValue("x/leased"), "=", g.ID),
			clientv3.Compare(clientv3.LeaseValue("x/plain"), "=", clientv3.NoLease)).
		Then(clientv3.OpGet("x/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1))).
		Commit()
	say("lease compares: %s", txnText(r, err))
	put(cli, "x/new", "n", clientv3.WithPrevKV())

	// A short TTL: clientv3 renews every third of it, and learns of the
	// revocation at the next renewal.
	short, err := cli.Grant(ctx(), 3)
	if err != nil {
		fail("grant: %v", err)
	}
	kctx, kcancel := context.WithCancel(context.Background())
	defer kcancel()
	kc, err := cli.KeepAlive(kctx, short.ID)
	if err != nil {
		fail("keepalive: %v", err)
	}
	first := <-kc
	say("keepalive: ttl %d", ttlOf(first))
	if _, err := cli.Revoke(ctx(), short.ID); err != nil {
		fail("revoke: %v", err)
	}
	// clientv3 closes the channel once the server says the lease is gone.
	closed := false
	deadline := time.After(30 * time.Second)
	for !closed {
		select {
		case _, ok := <-kc:
			closed = !ok
		case <-deadline:
			fail("the keep-alive channel of a revoked lease stayed open")
		}
	}
	say("keepalive channel of the revoked lease: closed")

	// A watch from a future revision sees the writes once they happen.
	now, err := cli.Get(ctx(), "x/plain")
	if err != nil {
		fail("get: %v", err)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	future := cli.Watch(wctx, "y/", clientv3.WithPrefix(), clientv3.WithRev(now.Header.Revision+3))
	for i := 1; i <= 4; i++ {
		put(cli, fmt.Sprintf("y/%d", i), "v")
	}
	say("watch from revision now+3:")
	events(future, 2)

	// Many watches on one stream; cancelling one leaves the others.
	var chans []clientv3.WatchChan
	var cancels []context.CancelFunc
	for i := 0; i < 20; i++ {
		c, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		chans = append(chans, cli.Watch(c, fmt.Sprintf("z/%02d", i), clientv3.WithCreatedNotify()))
	}
	for _, ch := range chans {
		next(ch, "created")
	}
	cancels[0]()
	for i := 0; i < 20; i++ {
		put(cli, fmt.Sprintf("z/%02d", i), "v")
	}
	for i, ch := range chans[1:] {
		e := events(ch, 1)
		if string(e[0].Kv.Key) != fmt.Sprintf("z/%02d", i+1) {
			fail("watch %d got %s", i+1, e[0].Kv.Key)
		}
	}
	for _, cancel := range cancels {
		cancel()
	}
	select {
	case r, ok := <-chans[0]:
		if ok && len(r.Events) > 0 {
			fail("a cancelled watch delivered %d events", len(r.Events))
		}
	case <-time.After(step):
		fail("a cancelled watch's channel stayed open")
	}
	say("a cancelled watch delivers nothing more")

	// A watch response larger than the request limit (a 1.2 MB overwrite
	// with previous values: 2.4 MB of events) arrives whole to a client
	// that asked for fragments.
	overwrite := func(fill string) *clientv3.TxnResponse {
		ops := []clientv3.Op{}
		for i := 0; i < 12; i++ {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("frag/%02d", i), strings.Repeat(fill, 100*1024)))
		}
		r, err := cli.Txn(ctx()).Then(ops...).Commit()
		if err != nil {
			fail("txn of 1.2 MB: %v", err)
		}
		return r
	}
	overwrite("f")
	fctx, fcancel := context.WithCancel(context.Background())
	defer fcancel()
	fw := cli.Watch(fctx, "frag/", clientv3.WithPrefix(), clientv3.WithFragment(),
		clientv3.WithPrevKV(), clientv3.WithCreatedNotify())
	next(fw, "created")
	r = overwrite("g")
	resp := next(fw, "fragmented events")
	if len(resp.Events) == 0 {
		fail("fragmented watch: a response without events: %+v", resp)
	}
	say("fragmented watch: %d events in one response at rev %d (txn rev %d), canceled %v",
		len(resp.Events), resp.Events[0].Kv.ModRevision, r.Header.Revision, resp.Canceled)

	get(cli, "everything, count only", "", clientv3.WithPrefix(), clientv3.WithCountOnly())
	get(cli, "oldest two by create revision", "", clientv3.WithFromKey(), clientv3.WithLimit(2),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithKeysOnly())
	d, err := cli.Delete(ctx(), "", clientv3.WithFromKey())
	if err != nil {
		say("delete everything: %s", errText(err))
	} else {
		say("delete everything: rev %d deleted %d", d.Header.Revision, d.Deleted)
	}
	get(cli, "everything after", "", clientv3.WithFromKey(), clientv3.WithCountOnly())
}

func ttlOf(r *clientv3.LeaseKeepAliveResponse) int64 {
	if r == nil {
		return 0
	}
	return r.TTL
}

func session(cli *clientv3.Client) *concurrency.Session {
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	if err != nil {
		fail("session: %v", err)
	}
	return s
}

// contend has two sessions take the mutex `name` in turn: the second
// waits while the first holds it, and gets it once it is released.
func contend(s1, s2 *concurrency.Session, name string) {
	m1, m2 := concurrency.NewMutex(s1, name), concurrency.NewMutex(s2, name)
	say("m1 lock: %s", errText(m1.Lock(ctx())))
	acquired := make(chan error, 1)
	go func() { acquired <- m2.Lock(context.Background()) }()
	select {
	case err := <-acquired:
		say("m2 got the lock m1 holds: %s", errText(err))
	case <-time.After(500 * time.Millisecond):
		say("m2 waits while m1 holds the lock")
	}
	r, err := s1.Client().Txn(ctx()).If(m1.IsOwner()).Commit()
	say("m1 is owner: %s", txnText(r, err))
	say("m1 unlock: %s", errText(m1.Unlock(ctx())))
	select {
	case err := <-acquired:
		say("m2 lock: %s", errText(err))
	case <-time.After(step):
		fail("m2 never got the lock")
	}
	say("m2 unlock: %s", errText(m2.Unlock(ctx())))
}

func locksElectionsAndSTM(cli *clientv3.Client) {
	section("lock, election, stm")
	s1, s2 := session(cli), session(cli)
	defer s1.Close()
	defer s2.Close()
	contend(s1, s2, "/locks/x")

	e1, e2 := concurrency.NewElection(s1, "/election/x"), concurrency.NewElection(s2, "/election/x")
	say("e1 campaign: %s", errText(e1.Campaign(ctx(), "one")))
	octx, ocancel := context.WithCancel(context.Background())
	defer ocancel()
	observed := e1.Observe(octx)
	leaderValue := func(what string) string {
		select {
		case r, ok := <-observed:
			if !ok || len(r.Kvs) == 0 {
				fail("observe closed waiting for %s", what)
			}
			return string(r.Kvs[0].Value)
		case <-time.After(step):
			fail("nothing observed waiting for %s", what)
		}
		return ""
	}
	say("observed: %s", leaderValue("the first leader"))
	won := make(chan error, 1)
	go func() { won <- e2.Campaign(context.Background(), "two") }()
	say("e1 proclaim: %s", errText(e1.Proclaim(ctx(), "one, again")))
	say("observed: %s", leaderValue("the proclamation"))
	l, err := e2.Leader(ctx())
	if err != nil {
		fail("leader: %v", err)
	}
	say("leader: %s", l.Kvs[0].Value)
	say("e1 resign: %s", errText(e1.Resign(ctx())))
	select {
	case err := <-won:
		say("e2 campaign: %s", errText(err))
	case <-time.After(step):
		fail("e2 never won")
	}
	say("observed: %s", leaderValue("the second leader"))
	say("e2 resign: %s", errText(e2.Resign(ctx())))
	_, err = e1.Leader(ctx())
	say("leader with nobody elected: %s", errText(err))

	// Five clients add to one counter through STM transactions: no
	// increment may be lost to a conflict.
	put(cli, "/stm/counter", "0")
	var wg sync.WaitGroup
	for c := 0; c < 5; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				_, err := concurrency.NewSTM(cli, func(stm concurrency.STM) error {
					var n int
					fmt.Sscanf(stm.Get("/stm/counter"), "%d", &n)
					stm.Put("/stm/counter", fmt.Sprint(n+1))
					return nil
				}, concurrency.WithIsolation(concurrency.Serializable))
				if err != nil {
					fail("stm: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	g, err := cli.Get(ctx(), "/stm/counter")
	if err != nil {
		fail("get counter: %v", err)
	}
	say("stm counter after 50 increments: %s (version %d)", g.Kvs[0].Value, g.Kvs[0].Version)
}

func clientSideWrappers(cli *clientv3.Client) {
	section("namespace, mirror, leasing")
	ns := namespace.NewKV(cli.KV, "ns1/")
	put(ns, "x", "in a namespace")
	get(cli, "ns1/x through the plain client", "ns1/x")
	get(ns, "everything in the namespace", "", clientv3.WithFromKey())

	put(cli, "/mirror/a", "1")
	put(cli, "/mirror/b", "2")
	syncer := mirror.NewSyncer(cli, "/mirror/", 0)
	base, errs := syncer.SyncBase(ctx())
	for r := range base {
		say("mirror base: %s", getText(&r))
	}
	if err := <-errs; err != nil {
		fail("sync base: %v", err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	updates := syncer.SyncUpdates(wctx)
	put(cli, "/mirror/c", "3")
	say("mirror update:")
	events(updates, 1)

	put(cli, "/leasing/k", "1")
	lkv1, close1, err := leasing.NewKV(cli, "/leasing-owners/", concurrency.WithTTL(10))
	if err != nil {
		fail("leasing kv: %v", err)
	}
	defer close1()
	lkv2, close2, err := leasing.NewKV(cli, "/leasing-owners/", concurrency.WithTTL(10))
	if err != nil {
		fail("leasing kv: %v", err)
	}
	defer close2()
	g, err := lkv1.Get(ctx(), "/leasing/k")
	if err != nil {
		fail("leasing get: %v", err)
	}
	say("leasing 1 reads: %s", g.Kvs[0].Value)
	if _, err := lkv2.Put(ctx(), "/leasing/k", "2"); err != nil {
		fail("leasing put: %v", err)
	}
	g, err = lkv1.Get(ctx(), "/leasing/k")
	if err != nil {
		fail("leasing get: %v", err)
	}
	say("leasing 1 reads after leasing 2 wrote: %s", g.Kvs[0].Value)
	g, err = cli.Get(ctx(), "/leasing/k")
	if err != nil {
		fail("get: %v", err)
	}
	say("plain read: %s", g.Kvs[0].Value)
	// Closing a leasing KV stops its session's keep-alives without
	// revoking it: its ownership keys would go when the lease expires,
	// at a moment no later line may depend on. Deleted now instead.
	close1()
	close2()
	d, err := cli.Delete(ctx(), "/leasing-owners/", clientv3.WithPrefix())
	if err != nil {
		fail("delete the leasing owners' keys: %v", err)
	}
	say("leasing owners' keys deleted: %d", d.Deleted)
}

func cluster(cli *clientv3.Client) {
	section("cluster")
	l, err := cli.MemberList(ctx())
	if err != nil {
		fail("member list: %v", err)
	}
	say("members: %d, client URLs of the first: %d", len(l.Members), len(l.Members[0].ClientURLs))
	a, err := cli.MemberAddAsLearner(ctx(), []string{"http://127.0.0.1:1"})
	say("add learner: %s", errText(err))
	if err != nil {
		return
	}
	say("add learner: learner %v, members %d", a.Member.IsLearner, len(a.Members))
	_, err = cli.MemberPromote(ctx(), a.Member.ID)
	say("promote a learner that never started: %s", errText(err))
	// Not the learner's URL set alone: etcd derives a runtime member's ID
	// from its URLs and the Unix second, so that would collide on the ID
	// or not depending on the clock.
	_, err = cli.MemberAdd(ctx(), []string{"http://127.0.0.1:2", "http://127.0.0.1:1"})
	say("add a member with one of the learner's peer URLs: %s", errText(err))
	_, err = cli.MemberRemove(ctx(), a.Member.ID)
	say("remove the learner: %s", errText(err))
	_, err = cli.MemberRemove(ctx(), a.Member.ID)
	say("remove it again: %s", errText(err))
	l, err = cli.MemberList(ctx())
	if err != nil {
		fail("member list: %v", err)
	}
	say("members: %d", len(l.Members))
}

func maintenance(cli *clientv3.Client) {
	section("maintenance")
	st, err := cli.Status(ctx(), endpoint)
	if err != nil {
		fail("status: %v", err)
	}
	say("status: leader is the member %v, db size > 0 %v, learner %v, errors %v",
		st.Leader == st.Header.MemberId, st.DbSize > 0, st.IsLearner, st.Errors)
	alarms, err := cli.AlarmList(ctx())
	if err != nil {
		fail("alarm list: %v", err)
	}
	say("alarms: %d", len(alarms.Alarms))
	_, err = cli.Defragment(ctx(), endpoint)
	say("defragment: %s", errText(err))
	_, err = cli.MoveLeader(ctx(), 12345)
	say("move leader to a stranger: %s", errText(err))
}

func auth(cli *clientv3.Client) {
	section("auth")
	_, err := cli.AuthEnable(ctx())
	say("enable without root: %s", errText(err))
	steps := []struct {
		what string
		do   func() error
	}{
		{"add root", func() error { _, err := cli.UserAdd(ctx(), "root", "rootpw"); return err }},
		{"grant root", func() error { _, err := cli.UserGrantRole(ctx(), "root", "root"); return err }},
		{"add role r", func() error { _, err := cli.RoleAdd(ctx(), "r"); return err }},
		{"add role r again", func() error { _, err := cli.RoleAdd(ctx(), "r"); return err }},
		{"grant r on auth/", func() error {
			_, err := cli.RoleGrantPermission(ctx(), "r", "auth/", clientv3.GetPrefixRangeEnd("auth/"),
				clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		}},
		{"add user u", func() error { _, err := cli.UserAdd(ctx(), "u", "upw"); return err }},
		{"grant u a missing role", func() error { _, err := cli.UserGrantRole(ctx(), "u", "nope"); return err }},
		{"grant u r", func() error { _, err := cli.UserGrantRole(ctx(), "u", "r"); return err }},
		{"enable", func() error { _, err := cli.AuthEnable(ctx()); return err }},
	}
	for _, s := range steps {
		say("%s: %s", s.what, errText(s.do()))
	}
	_, err = cli.Get(ctx(), "auth/x")
	say("get without a user: %s", errText(err))

	u := connect("u", "upw")
	defer u.Close()
	put(u, "auth/x", "mine")
	put(u, "elsewhere", "not mine")
	get(u, "auth/x as u", "auth/x")
	_, err = u.UserAdd(ctx(), "v", "vpw")
	say("u adds a user: %s", errText(err))
	ru, err := u.UserGet(ctx(), "u")
	if err != nil {
		say("u reads itself: %s", errText(err))
	} else {
		say("u reads itself: roles %v", ru.Roles)
	}

	_, err = clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: step,
		Username:    "u",
		Password:    "wrong",
	})
	say("wrong password: %s", errText(err))

	root := connect("root", "rootpw")
	defer root.Close()
	role, err := root.RoleGet(ctx(), "r")
	if err != nil {
		fail("role get: %v", err)
	}
	for _, p := range role.Perm {
		say("role r: %s [%s, %s)", p.PermType, p.Key, p.RangeEnd)
	}
	users, err := root.UserList(ctx())
	if err != nil {
		fail("user list: %v", err)
	}
	say("users: %v", users.Users)
	_, err = root.UserDelete(ctx(), "nobody")
	say("delete a missing user: %s", errText(err))
	_, err = root.AuthDisable(ctx())
	say("disable: %s", errText(err))
	get(cli, "auth/x without a user again", "auth/x")
}

// clusterMain is the transcript of a multi-member cluster: a client that
// knows every member, and one client per member.
func clusterMain(endpoints []string) {
	all := connectTo(endpoints, "", "")
	defer all.Close()
	per := make([]*clientv3.Client, len(endpoints))
	for i, ep := range endpoints {
		per[i] = connectTo([]string{ep}, "", "")
		defer per[i].Close()
	}

	section("members")
	l, err := all.MemberList(ctx())
	if err != nil {
		fail("member list: %v", err)
	}
	names := []string{}
	for _, m := range l.Members {
		names = append(names, fmt.Sprintf("%s learner=%v peer URLs %d client URLs %d",
			m.Name, m.IsLearner, len(m.PeerURLs), len(m.ClientURLs)))
	}
	sort.Strings(names)
	for _, n := range names {
		say("member %s", n)
	}
	ids := make([]uint64, len(endpoints))
	leaders := map[uint64]bool{}
	for i, ep := range endpoints {
		st, err := all.Status(ctx(), ep)
		if err != nil {
			fail("status of %s: %v", ep, err)
		}
		ids[i] = st.Header.MemberId
		leaders[st.Leader] = true
	}
	leader := -1
	for i, id := range ids {
		if leaders[id] {
			leader = i
		}
	}
	say("every member names the same leader, one of them: %v", len(leaders) == 1 && leader >= 0)
	if leader < 0 {
		fail("no leader among %v", ids)
	}

	section("writes on every member, linearizable reads on every member")
	for i := range endpoints {
		put(per[i], fmt.Sprintf("k/%d", i), fmt.Sprintf("written through member %d", i))
	}
	for i := range endpoints {
		get(per[i], fmt.Sprintf("k/ through member %d", i), "k/", clientv3.WithPrefix())
	}
	get(all, "k/ through the client of every member", "k/", clientv3.WithPrefix())

	section("watch on one member, write on another")
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	last := len(endpoints) - 1
	w := per[0].Watch(wctx, "w/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	next(w, "created")
	put(per[last], "w/x", "1")
	put(per[last], "w/x", "2")
	events(w, 2)

	section("hashkv on every member")
	head, err := all.Get(ctx(), "k/0")
	if err != nil {
		fail("get: %v", err)
	}
	rev := head.Header.Revision
	hashes := map[uint32]bool{}
	var hash uint32
	for i, ep := range endpoints {
		// A linearizable read through the member first: it has applied rev.
		if _, err := per[i].Get(ctx(), "k/0"); err != nil {
			fail("get: %v", err)
		}
		h, err := all.HashKV(ctx(), ep, rev)
		if err != nil {
			fail("hashkv of %s: %v", ep, err)
		}
		hashes[h.Hash] = true
		hash = h.Hash
	}
	say("hashkv at rev %d: the same on every member %v: %d", rev, len(hashes) == 1, hash)

	section("a lease across members")
	g, err := per[0].Grant(ctx(), 30)
	if err != nil {
		fail("grant: %v", err)
	}
	put(per[1], "l/x", "leased", clientv3.WithLease(g.ID))
	ttl, err := per[last].TimeToLive(ctx(), g.ID, clientv3.WithAttachedKeys())
	if err != nil {
		fail("timetolive: %v", err)
	}
	say("timetolive through another member: granted %d keys %d", ttl.GrantedTTL, len(ttl.Keys))
	ka, err := per[last].KeepAliveOnce(ctx(), g.ID)
	say("keepalive once through another member: %s ttl %d", errText(err), ttlOf(ka))
	_, err = per[1].Revoke(ctx(), g.ID)
	say("revoke through a third: %s", errText(err))
	get(per[0], "l/ after the revoke", "l/", clientv3.WithPrefix())

	section("a lock across members")
	s1, s2 := session(per[0]), session(per[last])
	defer s1.Close()
	defer s2.Close()
	contend(s1, s2, "/locks/c")

	section("leadership transfer")
	target := (leader + 1) % len(endpoints)
	_, err = per[leader].MoveLeader(ctx(), ids[target])
	say("move leader, asked of the leader: %s", errText(err))
	moved := false
	deadline := time.Now().Add(step)
	for !moved && time.Now().Before(deadline) {
		st, err := all.Status(ctx(), endpoints[target])
		moved = err == nil && st.Leader == ids[target]
		if !moved {
			time.Sleep(50 * time.Millisecond)
		}
	}
	say("the target leads: %v", moved)
	other := (target + 1) % len(endpoints)
	_, err = per[other].MoveLeader(ctx(), ids[other])
	say("move leader, asked of a follower: %s", errText(err))
	put(per[other], "k/after-move", "x")
	get(per[leader], "k/after-move through the old leader", "k/after-move")

	section("a learner")
	// etcd's strict reconfiguration check refuses membership changes
	// ("unhealthy cluster") until the member that takes the request has
	// been connected to every voter for 5 s: a fresh cluster waits.
	var a *clientv3.MemberAddResponse
	deadline = time.Now().Add(30 * time.Second)
	for {
		a, err = all.MemberAddAsLearner(ctx(), []string{"http://127.0.0.1:1"})
		if err == nil || !strings.Contains(err.Error(), "unhealthy cluster") || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		fail("add learner: %v", err)
	}
	say("add learner: learner %v, members %d", a.Member.IsLearner, len(a.Members))
	// etcd 3.4 judges a learner's readiness from the leader's Raft
	// progress and lets a promotion through when the learner is not in it
	// yet: a promotion that reaches the leader before it has applied the
	// addition is accepted. Wait until every member lists the learner, so
	// that both servers answer what they answer about a learner that
	// never caught up.
	listed := 0
	deadline = time.Now().Add(step)
	for listed < len(endpoints) && time.Now().Before(deadline) {
		listed = 0
		for i := range endpoints {
			l, err := per[i].MemberList(ctx())
			if err == nil && len(l.Members) == len(endpoints)+1 {
				listed++
			}
		}
		if listed < len(endpoints) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	say("every member lists the learner: %v", listed == len(endpoints))
	_, err = all.MemberPromote(ctx(), a.Member.ID)
	say("promote the learner that never started: %s", errText(err))
	_, err = all.MemberRemove(ctx(), a.Member.ID)
	say("remove the learner: %s", errText(err))
	// MemberList is answered from the member's own state (etcd 3.4 has no
	// linearizable MemberList): a member other than the one that took the
	// removal may list the learner until it applies the change.
	deadline = time.Now().Add(step)
	for {
		l, err = all.MemberList(ctx())
		if err != nil {
			fail("member list: %v", err)
		}
		if len(l.Members) == len(endpoints) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	say("members: %d", len(l.Members))
	fmt.Println("done")
}
