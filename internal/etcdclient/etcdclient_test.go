package etcdclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
)

// TestAgainstEtcdBinaries: the real etcd a 1.36 control plane runs (3.6.8)
// and a 1.37 one (3.7.0) answer every call: the member's own version, the
// one member with its client URL, no alarm, the keys written.
func TestAgainstEtcdBinaries(t *testing.T) {
	for _, v := range []string{"v3.6.8", "v3.7.0"} {
		t.Run(v, func(t *testing.T) {
			bin := testbin.Etcd(t, v)
			n := testutil.NewNode(t, "cp1")
			e := etcdtest.StartBinary(t, n, bin, "registry.k8s.io/etcd:"+strings.TrimPrefix(v, "v")+"-0")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c := New(e.ClientURL, e.TLS(), 5*time.Second)
			defer c.Close()
			before, err := c.CountAll(ctx, 0, false)
			if err != nil {
				t.Fatal(err)
			}
			e.PutKeys("/registry/a/", 7, 16)
			st, err := c.Status(ctx, e.ClientURL)
			if err != nil || st.Version != strings.TrimPrefix(v, "v") || st.ClusterID != e.ClusterID() || st.Leader == 0 || st.MemberID != st.Leader || st.Revision == 0 || st.DBSize == 0 {
				t.Fatalf("status %+v %v", st, err)
			}
			ml, err := c.MemberList(ctx, true)
			if err != nil || len(ml) != 1 || ml[0].Name != "cp1" || ml[0].ID != st.MemberID || len(ml[0].ClientURLs) != 1 || ml[0].ClientURLs[0] != e.ClientURL {
				t.Fatalf("members %+v %v", ml, err)
			}
			if al, err := c.AlarmList(ctx); err != nil || len(al) != 0 {
				t.Fatalf("alarms %+v %v", al, err)
			}
			if n, err := c.CountAll(ctx, st.Revision, true); err != nil || n != before+7 {
				t.Fatalf("count at %d: %d %v, want %d", st.Revision, n, err, before+7)
			}
			// A revision compacted away is told apart.
			e.PutKeys("/registry/b/", 1, 16)
			ref := e.Client()
			defer ref.Close()
			if _, err := ref.Compact(ctx, st.Revision+1); err != nil {
				t.Fatal(err)
			}
			if _, err := c.CountAll(ctx, st.Revision, true); !IsCompacted(err) {
				t.Fatalf("count at a compacted revision: %v, want compacted", err)
			}
			if IsCompacted(errors.New("etcdserver: mvcc: required revision has been compacted")) {
				t.Fatal("a message alone is not etcd's answer")
			}
		})
	}
}

// TestWaitsForTheMemberAndNamesTheLastAttempt: nobody listening is waited
// for until the call's deadline, which is then its error, with what the
// last attempt met (clientv3 alone says only "context deadline
// exceeded"); a member that comes up meanwhile answers.
func TestWaitsForTheMemberAndNamesTheLastAttempt(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c := New("https://"+addr, nil, time.Second)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.MemberList(ctx, false)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) < 500*time.Millisecond || time.Since(start) > 5*time.Second {
		t.Fatalf("after %s: %v", time.Since(start), err)
	}
	if !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("the last attempt's error is not named: %v", err)
	}

	// Calls made while the member restarts wait for it and are answered.
	n := testutil.NewNode(t, "cp1")
	e := etcdtest.Start(t, n, etcdtest.Config{})
	c = New(e.ClientURL, e.TLS(), time.Second)
	defer c.Close()
	stop, errs := make(chan struct{}), make(chan error, 1)
	go func() {
		defer close(errs)
		for calls := 0; ; calls++ {
			select {
			case <-stop:
				if calls == 0 {
					errs <- errors.New("no call made")
				}
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			_, err := c.Status(ctx, e.ClientURL)
			cancel()
			if err != nil {
				errs <- err
				return
			}
		}
	}()
	time.Sleep(100 * time.Millisecond)
	e.Restart()
	time.Sleep(100 * time.Millisecond)
	close(stop)
	if err := <-errs; err != nil {
		t.Fatalf("a call across a restart: %v", err)
	}
}

// TestLeaderChangesOnThreeMembers: on a real 3-member etcd, linearizable
// calls through one member keep being answered while the leadership moves
// from member to member and while the leader is lost; with quorum lost,
// a call ends at its deadline and names what it met.
func TestLeaderChangesOnThreeMembers(t *testing.T) {
	n := testutil.NewNode(t, "cp1")
	ms := etcdtest.StartCluster(t, n, 3)
	c := New(ms[0].ClientURL, ms[0].TLS(), 5*time.Second)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	leader := func() (int, uint64) {
		t.Helper()
		st, err := c.Status(ctx, ms[0].ClientURL)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range ms {
			if m.Embedded() != nil && uint64(m.Embedded().Server.MemberID()) == st.Leader {
				return i, st.Leader
			}
		}
		t.Fatalf("leader %x is none of the members", st.Leader)
		return 0, 0
	}
	stop, errs := make(chan struct{}), make(chan error, 1)
	calls := 0
	go func() {
		defer close(errs)
		for {
			select {
			case <-stop:
				return
			default:
			}
			cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
			ml, err := c.MemberList(cctx, false)
			if err == nil && len(ml) != 3 {
				err = fmt.Errorf("%d members", len(ml))
			}
			if err == nil {
				_, err = c.CountAll(cctx, 0, false)
			}
			ccancel()
			if err != nil {
				errs <- err
				return
			}
			calls++
		}
	}()
	// Move the leadership around twice, through the leader's own client.
	for round := 0; round < 4; round++ {
		li, lid := leader()
		to := ms[(li+1)%3]
		ref := ms[li].Client()
		_, err := ref.MoveLeader(ctx, uint64(to.Embedded().Server.MemberID()))
		ref.Close()
		if err != nil {
			t.Fatalf("move leader from %x: %v", lid, err)
		}
	}
	// Lose the leader (not the member the client talks to): a new one is
	// elected and the calls go on.
	li, _ := leader()
	if li == 0 {
		ref := ms[0].Client()
		if _, err := ref.MoveLeader(ctx, uint64(ms[1].Embedded().Server.MemberID())); err != nil {
			t.Fatal(err)
		}
		ref.Close()
		li, _ = leader()
	}
	ms[li].Stop()
	time.Sleep(2 * time.Second)
	close(stop)
	if err := <-errs; err != nil {
		t.Fatalf("a call across leader changes (after %d calls): %v", calls, err)
	}
	if calls < 3 {
		t.Fatalf("only %d calls made", calls)
	}
	// Quorum lost: a linearizable call cannot be answered, and says what
	// it met when its deadline ends it.
	for _, m := range ms[1:] {
		m.Stop()
	}
	qctx, qcancel := context.WithTimeout(ctx, 2*time.Second)
	defer qcancel()
	_, err := c.MemberList(qctx, false)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "last attempt") {
		t.Fatalf("with quorum lost: %v", err)
	}
}

// hostileCluster is a peer that answers the member list with what an etcd
// under an attacker's control could: a stand-in for the one thing a real
// etcd will not do, served over gRPC with etcd's own generated types.
type hostileCluster struct {
	pb.UnimplementedClusterServer
	members int
	name    string
}

func (h hostileCluster) MemberList(context.Context, *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	out := &pb.MemberListResponse{Header: &pb.ResponseHeader{ClusterId: 1}}
	for i := 0; i < h.members; i++ {
		out.Members = append(out.Members, &pb.Member{ID: uint64(i + 1), Name: h.name, ClientURLs: []string{"http://127.0.0.1:1"}})
	}
	return out, nil
}

func serveHostile(t *testing.T, h hostileCluster) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	pb.RegisterClusterServer(s, h)
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return "http://" + l.Addr().String()
}

// TestAHostileMemberListIsBounded: a member list of 200,000 members is
// refused by its size before it is read whole; one of many small members
// by its count, before anything is done per member; a member name of
// 16 MiB by the size. Each ends at once, with a bounded error.
func TestAHostileMemberListIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    hostileCluster
		want string
	}{
		{"200,000 members", hostileCluster{members: 200000, name: "m"}, "larger than max"},
		{"5,000 small members", hostileCluster{members: 5000}, "more than 64"},
		{"a 16 MiB name", hostileCluster{members: 1, name: strings.Repeat("n", 16<<20)}, "larger than max"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := serveHostile(t, tc.h)
			c := New(ep, nil, time.Second)
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			g := runtime.NumGoroutine()
			start := time.Now()
			ml, err := c.MemberList(ctx, true)
			if err == nil || !strings.Contains(err.Error(), tc.want) || ml != nil {
				t.Fatalf("%d members, %v; want an error saying %q", len(ml), err, tc.want)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("refused after %s", d)
			}
			if len(err.Error()) > 512 {
				t.Fatalf("an unbounded error: %d bytes", len(err.Error()))
			}
			if now := runtime.NumGoroutine(); now > g+50 {
				t.Fatalf("%d goroutines after the call, %d before", now, g)
			}
		})
	}
	// A real list within the bounds is read.
	ep := serveHostile(t, hostileCluster{members: MaxMembers, name: "m"})
	c := New(ep, nil, time.Second)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if ml, err := c.MemberList(ctx, true); err != nil || len(ml) != MaxMembers {
		t.Fatalf("%d members, %v", len(ml), err)
	}
}

// TestEndpointsAreCheckedBeforeTheyAreDialled: a client URL a member list
// names is dialled only when it is an http(s) URL of a host.
func TestEndpointsAreCheckedBeforeTheyAreDialled(t *testing.T) {
	c := New("https://127.0.0.1:1", nil, time.Second)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, ep := range []string{"unix:///run/x.sock", "unixs://x", "127.0.0.1:2379", "https://user:pw@127.0.0.1:2379", "https://127.0.0.1:2379/x/../y", "https:///nohost", "ftp://127.0.0.1:21"} {
		start := time.Now()
		_, err := c.Status(ctx, ep)
		if err == nil || !strings.Contains(err.Error(), "not an http(s) URL") || time.Since(start) > time.Second {
			t.Errorf("%q: %v after %s", ep, err, time.Since(start))
		}
		if strings.Contains(err.Error(), "pw") {
			t.Errorf("%q: the endpoint is quoted: %v", ep, err)
		}
	}
	bad := New("unix:///run/x.sock", nil, time.Second)
	if _, err := bad.MemberList(ctx, false); err == nil || !strings.Contains(err.Error(), "not an http(s) URL") {
		t.Fatalf("a bad endpoint: %v", err)
	}
	if bad.Close() != nil {
		t.Fatal("close of a client that never dialled")
	}
}
