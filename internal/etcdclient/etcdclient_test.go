package etcdclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
)

// TestSameAnswersAsClientv3: against a real (embedded) etcd with kubeadm's
// PKI, every call reads what go.etcd.io/etcd/client/v3 reads, and fails
// as it does.
func TestSameAnswersAsClientv3(t *testing.T) {
	n := testutil.NewNode(t, "cp1")
	e := etcdtest.Start(t, n, etcdtest.Config{})
	e.PutKeys("/registry/a/", 10, 16)
	ref := e.Client()
	defer ref.Close()
	c := New(e.ClientURL, e.TLS(), 5*time.Second)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for _, serializable := range []bool{false, true} {
		var opts []clientv3.OpOption
		if serializable {
			opts = append(opts, clientv3.WithSerializable())
		}
		want, err := ref.MemberList(ctx, opts...)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.MemberList(ctx, serializable)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want.Members) || len(got) != 1 {
			t.Fatalf("members: %+v, want %+v", got, want.Members)
		}
		for i, m := range want.Members {
			w := Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, IsLearner: m.IsLearner}
			if !reflect.DeepEqual(got[i], w) {
				t.Errorf("member %d: %+v, want %+v", i, got[i], w)
			}
		}
	}

	want, err := ref.Status(ctx, e.ClientURL)
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(ctx, e.ClientURL)
	if err != nil {
		t.Fatal(err)
	}
	if st.ClusterID != want.Header.ClusterId || st.MemberID != want.Header.MemberId || st.Version != want.Version ||
		st.DBSize != want.DbSize || st.Leader != want.Leader || st.IsLearner != want.IsLearner || st.ClusterID == 0 || st.Version == "" {
		t.Errorf("status %+v, want %+v", st, want)
	}

	wantCount, err := ref.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithRev(st.Revision), clientv3.WithSerializable())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.CountAll(ctx, st.Revision, true); err != nil || got != wantCount.Count || got != 10 {
		t.Errorf("count: %d %v, want %d", got, err, wantCount.Count)
	}
	if got, err := c.CountAll(ctx, 0, false); err != nil || got != 10 {
		t.Errorf("count (latest, linearizable): %d %v", got, err)
	}

	if al, err := c.AlarmList(ctx); err != nil || len(al) != 0 {
		t.Errorf("alarms on a healthy member: %+v %v", al, err)
	}
	// A raised alarm reads as clientv3 reads it.
	if _, err := pb.NewMaintenanceClient(ref.ActiveConnection()).Alarm(ctx, &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: st.MemberID, Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	wantAl, err := ref.AlarmList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	al, err := c.AlarmList(ctx)
	if err != nil || len(al) != 1 || len(wantAl.Alarms) != 1 || al[0].MemberID != wantAl.Alarms[0].MemberID ||
		fmt.Sprint(al[0].Type) != fmt.Sprint(wantAl.Alarms[0].Alarm) || al[0].Type.String() != "NOSPACE" {
		t.Errorf("alarms %+v %v, want %+v", al, err, wantAl.Alarms)
	}
	if _, err := ref.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: st.MemberID, Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}

	// A compacted revision: rpctypes.ErrCompacted, with its message.
	e.PutKeys("/registry/b/", 3, 16)
	latest, err := c.Status(ctx, e.ClientURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ref.Compact(ctx, latest.Revision); err != nil {
		t.Fatal(err)
	}
	_, refErr := ref.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithRev(st.Revision), clientv3.WithSerializable())
	_, err = c.CountAll(ctx, st.Revision, true)
	if !errors.Is(refErr, rpctypes.ErrCompacted) || !IsCompacted(err) || err.Error() != refErr.Error() {
		t.Errorf("compacted: %v, clientv3 %v", err, refErr)
	}
	// A revision in the future: another etcd error, not compacted.
	_, refErr = ref.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithRev(latest.Revision+100))
	if _, err = c.CountAll(ctx, latest.Revision+100, false); err == nil || IsCompacted(err) || err.Error() != refErr.Error() {
		t.Errorf("future revision: %v, clientv3 %v", err, refErr)
	}

	// Another CA's client certificate is refused: never an answer.
	other := testutil.NewNode(t, "other")
	etcdtest.NewPKI(t, other)
	kp, err := tls.LoadX509KeyPair(other.Path(etcdtest.HCCert), other.Path(etcdtest.HCKey))
	if err != nil {
		t.Fatal(err)
	}
	badTLS := e.TLS()
	badTLS.Certificates = []tls.Certificate{kp}
	bad := New(e.ClientURL, badTLS, 2*time.Second)
	bctx, bcancel := context.WithTimeout(ctx, 2*time.Second)
	defer bcancel()
	if _, err := bad.MemberList(bctx, true); err == nil {
		t.Error("a client of another CA got the member list")
	}
}

// TestWaitsForTheMemberUntilTheDeadline: nobody listening is waited for,
// as clientv3 waits for a ready connection, until the call's deadline,
// which is then its error; a member that comes up meanwhile answers.
func TestWaitsForTheMemberUntilTheDeadline(t *testing.T) {
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
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) < 500*time.Millisecond {
		t.Fatalf("after %s: %v", time.Since(start), err)
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

// FuzzAnswer: arbitrary bytes as an answer never panic a reader.
func FuzzAnswer(f *testing.F) {
	f.Add([]byte{0x0a, 0x02, 0x08, 0x01, 0x12, 0x05, 0x08, 0x01, 0x12, 0x01, 'a'})
	f.Add([]byte{0x12, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = fields(b, func(num int, typ byte, v uint64, data []byte) error {
			_, _ = header(data)
			return fields(data, func(int, byte, uint64, []byte) error { return nil })
		})
	})
}

// TestAgainstEtcdBinaries: the real etcd a 1.36 control plane runs (3.6.8)
// and a 1.37 one (3.7.0) answer every call as clientv3 reads them.
func TestAgainstEtcdBinaries(t *testing.T) {
	for _, v := range []string{"v3.6.8", "v3.7.0"} {
		t.Run(v, func(t *testing.T) {
			bin := testbin.Etcd(t, v)
			n := testutil.NewNode(t, "cp1")
			e := etcdtest.StartBinary(t, n, bin, "registry.k8s.io/etcd:"+strings.TrimPrefix(v, "v")+"-0")
			e.PutKeys("/registry/a/", 7, 16)
			ref := e.Client()
			defer ref.Close()
			c := New(e.ClientURL, e.TLS(), 5*time.Second)
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			want, err := ref.Status(ctx, e.ClientURL)
			if err != nil {
				t.Fatal(err)
			}
			st, err := c.Status(ctx, e.ClientURL)
			if err != nil || st.Version != strings.TrimPrefix(v, "v") || st.Version != want.Version || st.ClusterID != want.Header.ClusterId || st.DBSize != want.DbSize {
				t.Fatalf("status %+v %v, want %+v", st, err, want)
			}
			ml, err := c.MemberList(ctx, true)
			if err != nil || len(ml) != 1 || ml[0].Name != "cp1" || len(ml[0].ClientURLs) != 1 || ml[0].ClientURLs[0] != e.ClientURL {
				t.Fatalf("members %+v %v", ml, err)
			}
			if al, err := c.AlarmList(ctx); err != nil || len(al) != 0 {
				t.Fatalf("alarms %+v %v", al, err)
			}
			wc, err := ref.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithRev(st.Revision), clientv3.WithSerializable())
			if err != nil {
				t.Fatal(err)
			}
			if n, err := c.CountAll(ctx, st.Revision, true); err != nil || n != wc.Count || n < 7 {
				t.Fatalf("count %d %v, want %d", n, err, wc.Count)
			}
		})
	}
}
