package reconcile

import (
	"context"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/internal/wait"
)

type countingRunner struct {
	n     atomic.Int64
	inner runner.Runner
}

func (c *countingRunner) Run(ctx context.Context, cmd runner.Cmd) (runner.Result, error) {
	c.n.Add(1)
	return c.inner.Run(ctx, cmd)
}

// convergedNode is a sandbox node converged at v1.37.2 in role, a member
// of a cluster played by a loopback HTTPS API.
func convergedNode(b *testing.B, role string) *testutil.Node {
	n, _ := convergedNodeAPI(b, role)
	return n
}

// convergedNodeAPI is convergedNode and the API stand-in its kubeconfigs
// name.
func convergedNodeAPI(b *testing.B, role string) (*testutil.Node, *testutil.API) {
	n := testutil.NewNode(b, "n1")
	api := testutil.NewAPI(b, "v1.37.2")
	n.ClusterFile(role, "v1.37.2", "")
	n.Bundle("v1.37.2")
	n.Member(api)
	api.SetNode("n1", "v1.37.2", true)
	if role == "controlplane" {
		n.ControlPlane("v1.37.2")
	} else {
		n.Write(paths.StatusMirror, "phase: Converged\nmember: true\nnodeVersion: v1.37.2\n", 0o644)
	}
	// As every pass that joined or upgraded the node to its pin leaves it.
	n.Write(paths.VerifiedRecord, "v1.37.2\n", 0o644)
	return n, api
}

// BenchmarkConvergedPass is a whole boot-time pass on a converged node of a
// sandbox root: lock, cluster file, bundle manifest, membership, node
// version, the verified record (at the pin: no API read), plan, status
// (two atomic writes), log lines to a real file. Target: under 20 ms and
// zero execs.
func BenchmarkConvergedPass(b *testing.B) {
	for _, role := range []string{"controlplane", "worker"} {
		b.Run(role, func(b *testing.B) {
			n := convergedNode(b, role)
			if err := os.MkdirAll(n.Path("/var/log"), 0o755); err != nil {
				b.Fatal(err)
			}
			f, err := os.OpenFile(n.Path(paths.ReconcileLog), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o640)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			cr := &countingRunner{inner: runner.Exec{Root: n.Root}}
			opts := Options{Root: n.R(), Runner: cr, Clock: wait.RealClock{}, Log: slog.New(slog.NewTextHandler(f, nil))}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				res := Run(context.Background(), opts)
				if res.ExitCode != ExitOK || len(res.Plan.Actions) != 0 {
					b.Fatalf("not converged: %d %+v", res.ExitCode, res.Plan)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cr.n.Load())/float64(b.N), "execs/op")
			if cr.n.Load() != 0 {
				b.Fatalf("a converged pass exec'd %d processes", cr.n.Load())
			}
		})
	}
}
