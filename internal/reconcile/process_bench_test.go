package reconcile

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// BenchmarkConvergedProcess is what a converged node pays on every boot:
// the whole `provider-kubernetes reconcile --root SANDBOX` process, from
// its exec to its exit (process start, every linked package's init, the
// pass, the exit), side by side with a bare `kubeadm version -o short` of
// the real kubeadm v1.37.2 the node bundles, started the same way. The
// sandbox is BenchmarkConvergedPass's converged node (cluster file, bundle
// manifest, kubelet.conf with a client certificate, the verified record
// at the pin, so no API read; an HTTPS API stand-in answers if one is
// made). Each iteration is one round: the
// bare kubeadm and each provider binary once, in an order that rotates
// every round; every provider run must exit 0 with phase Converged and no
// actions in its status.
//
// The provider is the binary `make build` makes from this tree (stripped,
// trimmed paths), or the ones named in CONVERGED_BENCH_PROVIDERS
// ("before=/path,after=/path": run side by side, each against the same
// bare runs). Reports min/median/max of both and of their per-round ratio.
// Target (issue 22, with client-go and etcd's client/v3 linked): median
// provider/kubeadm <= 0.6. Each role runs twice: with the API answering,
// and with it refusing connections (its endpoint closed), where a
// converged pass must still end in well under a second.
//
//	go test -run '^$' -bench BenchmarkConvergedProcess -benchtime 200x ./internal/reconcile/
func BenchmarkConvergedProcess(b *testing.B) {
	providers := testbin.Providers(b, "CONVERGED_BENCH_PROVIDERS", "kubeadm")
	kubeadm := testbin.Kubeadm(b, "v1.37.2")
	for _, sub := range []struct {
		role    string
		apiDown bool
	}{{"controlplane", false}, {"worker", false}, {"controlplane", true}, {"worker", true}} {
		role, name := sub.role, sub.role
		if sub.apiDown {
			name += "-api-refusing"
		}
		b.Run(name, func(b *testing.B) {
			n, api := convergedNodeAPI(b, role)
			if sub.apiDown {
				api.Close()
			}
			type job struct {
				name string
				bin  string
				args []string
			}
			jobs := []job{{name: "kubeadm", bin: kubeadm, args: []string{"version", "-o", "short"}}}
			for _, p := range providers {
				jobs = append(jobs, job{name: p.Name, bin: p.Path, args: []string{"reconcile", "--root", n.Root}})
			}
			took, cpu := map[string][]float64{}, map[string][]float64{}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for k := range jobs {
					j := jobs[(i+k)%len(jobs)] // rotate who runs first
					d, c, out, err := timeProcess(b, j.bin, j.args)
					b.StopTimer()
					if err != nil {
						b.Fatalf("%s %s: %v\n%s", j.bin, strings.Join(j.args, " "), err, out)
					}
					if j.name == "kubeadm" {
						if strings.TrimSpace(out) != "v1.37.2" {
							b.Fatalf("kubeadm version -o short: %q", out)
						}
					} else if doc, err := status.Read(n.R(), paths.StatusFile); err != nil || doc.Phase != status.PhaseConverged || len(doc.Actions) != 0 {
						b.Fatalf("%s: not a converged pass: %v %+v\n%s", j.name, err, doc, out)
					}
					took[j.name] = append(took[j.name], d.Seconds()*1000)
					cpu[j.name] = append(cpu[j.name], c.Seconds()*1000)
					b.StartTimer()
				}
			}
			b.StopTimer()
			bare := took["kubeadm"]
			b.ReportMetric(testutil.Median(bare), "kubeadm-ms")
			// One line each (the testing package keeps 10 lines of a
			// benchmark's log), and none for its N=1 probe run.
			log := fmt.Sprintf("%d rounds (%s), min / median / max:\n  kubeadm version -o short  %s (CPU %s)", b.N, name, testutil.MinMedianMax(bare, "%.1f ms"), testutil.MinMedianMax(cpu["kubeadm"], "%.1f"))
			for _, p := range providers {
				pt := took[p.Name]
				ratio := make([]float64, len(pt))
				for i := range pt {
					ratio[i] = pt[i] / bare[i] // the same round's kubeadm run
				}
				log += fmt.Sprintf("\n  %-24s  %s (CPU %s), per-round ratio %s (target <= 0.6), CPU ratio of medians %.3f",
					p.Name+" reconcile", testutil.MinMedianMax(pt, "%.1f ms"), testutil.MinMedianMax(cpu[p.Name], "%.1f"), testutil.MinMedianMax(ratio, "%.3f"), testutil.Median(cpu[p.Name])/testutil.Median(cpu["kubeadm"]))
				prefix := ""
				if len(providers) > 1 {
					prefix = p.Name + "-"
				}
				b.ReportMetric(testutil.Median(pt), prefix+"provider-ms")
				b.ReportMetric(testutil.Median(ratio), prefix+"provider/kubeadm")
				b.ReportMetric(testutil.Median(cpu[p.Name])/testutil.Median(cpu["kubeadm"]), prefix+"provider/kubeadm-CPU")
			}
			if b.N > 1 {
				b.Log(log)
			}
		})
	}
}

// timeProcess runs one command with the environment a unit gives it, timed
// from before its exec to its exit; cpu is its user and system time (less
// sensitive than the wall time to what else the machine runs).
func timeProcess(b *testing.B, bin string, args []string) (wall, cpu time.Duration, out string, err error) {
	cmd := testutil.Command(b, time.Minute, bin, args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "HOME=/root"}
	cmd.Dir = "/"
	var o bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &o
	t0 := time.Now()
	err = cmd.Run()
	wall = time.Since(t0)
	if cmd.ProcessState != nil {
		cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	return wall, cpu, o.String(), err
}
