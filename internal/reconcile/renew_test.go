package reconcile

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/certs"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/staticpods"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// renewEnv is a converged control plane at v1.37.2 whose providerConfig
// sets renewBefore (none: "") and whose apiserver certificate expires in
// left; its kubeadm renews by rewriting that certificate a year out.
type renewEnv struct {
	*env
	renewedTo time.Time
	config    string // what kubeadm was handed
	// listening plays the kubelet: the ports of the components whose
	// manifest is in place listen; stopped records that all were down.
	stopped bool
	ready   int
}

func newRenewEnv(t *testing.T, renewBefore string, left time.Duration) *renewEnv {
	e := &renewEnv{env: newEnv(t, "init", "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "")}
	section := testutil.ClusterSection("init", "v1.37.2", "    certificateValidityPeriod: 48h0m0s\n")
	if renewBefore != "" {
		section += "providerConfig:\n  certificates.renewBefore: " + renewBefore + "\n"
	}
	e.node.Write(paths.ClusterFile, section, 0o600)
	now := e.clock.Now().UTC()
	e.node.Write(paths.PKIDir+"/apiserver.crt", certExpiring(t, "kube-apiserver", now.Add(left).Truncate(time.Second)), 0o644)
	e.node.Write(paths.PKIDir+"/etcd/server.crt", certExpiring(t, "n1", now.Add(300*24*time.Hour)), 0o644)
	e.node.Write(paths.PKIDir+"/front-proxy-ca.crt", certExpiring(t, "front-proxy-ca", now.Add(10*time.Hour)), 0o644)
	e.renewedTo = now.Add(365 * 24 * time.Hour).Truncate(time.Second)
	reply := e.rec.Reply
	e.rec.Reply = func(ctx context.Context, c runner.Cmd) (runner.Result, error) {
		if strings.HasPrefix(c.String(), "/usr/bin/kubeadm certs renew all") {
			if b, err := os.ReadFile(c.Args[len(c.Args)-1]); err == nil {
				e.config = string(b)
			}
			if e.fail == "" {
				e.node.Write(paths.PKIDir+"/apiserver.crt", certExpiring(t, "kube-apiserver", e.renewedTo), 0o644)
			}
		}
		return reply(ctx, c)
	}
	return e
}

func (e *renewEnv) listening() (map[int]bool, error) {
	out, err := manifestsListen(e.node)()
	if len(out) == 0 {
		e.stopped = true
	}
	return out, err
}

func (e *renewEnv) run() Result {
	e.t.Helper()
	return Run(context.Background(), Options{Root: e.node.R(), Runner: e.rec, Clock: e.clock, Log: e.logger(),
		EtcdHealthy: func(context.Context) error { return nil }, Listening: e.listening,
		LocalAPIReady: func(context.Context) error {
			if !e.stopped {
				return errors.New("asked before the pods stopped")
			}
			e.ready++
			return nil
		}})
}

func manifests(t *testing.T, n *testutil.Node) map[string]string {
	out := map[string]string{}
	for _, c := range staticpods.Components {
		out[c] = n.Read(paths.ManifestsDir + "/" + c + ".yaml")
	}
	return out
}

func TestConvergedControlPlaneRenewsItsCertificates(t *testing.T) {
	e := newRenewEnv(t, "72h", 40*time.Hour)
	before := manifests(t, e.node)
	res := e.run()
	if res.ExitCode != ExitOK || res.Status.Phase != status.PhaseConverged {
		t.Fatalf("exit %d phase %s: %v", res.ExitCode, res.Status.Phase, res.Err)
	}
	// Exactly one command: the bundled kubeadm with its configuration,
	// which carries the cluster's validity and the certificate directory.
	want := []string{"/usr/bin/kubeadm certs renew all --config " + e.node.Path(certs.RenewConfigPath)}
	if got := e.lines(); !slices.Equal(got, want) {
		t.Fatalf("commands %q, want %q", got, want)
	}
	for _, s := range []string{"kind: ClusterConfiguration", "certificateValidityPeriod: 48h0m0s", "certificatesDir: " + e.node.Path(paths.PKIDir), "kubernetesVersion: v1.37.2"} {
		if !strings.Contains(e.config, s) {
			t.Fatalf("kubeadm was handed no %q:\n%s", s, e.config)
		}
	}
	if strings.Contains(e.config, testutil.Token) || e.node.Exists(certs.RenewConfigPath) {
		t.Fatal("the renewal config carries the token, or stayed")
	}
	// The static pods were stopped and started again: manifests back,
	// byte-identical, the apiserver waited for after.
	if !e.stopped || e.ready == 0 {
		t.Fatalf("stopped %v, ready asked %d times", e.stopped, e.ready)
	}
	if got := manifests(t, e.node); !mapsEqual(got, before) || e.node.Exists(staticpods.ParkDir) {
		t.Fatal("the manifests changed or the park directory stayed")
	}
	st := e.status(t)
	if st.Certificates == nil || st.Certificates.Soonest == nil || st.Certificates.Soonest.Name != "etcd-server" {
		t.Fatalf("certificates after the renewal %+v", st.Certificates)
	}
	a := status.Annotations(st)
	if a[status.AnnotationPrefix+status.KeyCertificateName] != "etcd-server" {
		t.Fatalf("annotations %v", a)
	}
	var renewed bool
	for _, ev := range st.Events {
		if ev.Type == "Normal" && ev.Reason == status.EventCertificatesRenewed && strings.Contains(ev.Message, "the soonest, etcd-server, now expires") {
			renewed = true
		}
	}
	if !renewed || !strings.Contains(st.Message, "renewed kubeadm's leaf certificates") {
		t.Fatalf("events %+v message %q", st.Events, st.Message)
	}
	e.logHas(t, "msg="+EventCertRenew, "outcome=ok", "soonest=apiserver", "renew_before=72h0m0s", "soonest_after=etcd-server")
	var apiserver string
	for _, c := range st.Certificates.All {
		if c.Name == "apiserver" {
			apiserver = c.NotAfter
		}
	}
	if apiserver != e.renewedTo.Format(time.RFC3339) {
		t.Fatalf("apiserver after the renewal: %+v", st.Certificates.All)
	}
	e.logHas(t, "msg="+string("restart-control-plane"), "outcome=ok")
	e.noSecrets(t)

	// The next pass: nothing due, nothing runs.
	e.logBuf = &testutil.SyncBuffer{}
	e.rec = &runner.Recorder{Reply: e.rec.Reply}
	if res := e.run(); res.ExitCode != ExitOK || res.Plan.Verdict != "none" || len(e.lines()) != 0 {
		t.Fatalf("second pass: exit %d plan %+v commands %q", res.ExitCode, res.Plan, e.lines())
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Not due (an authority expiring sooner does not count: kubeadm does not
// renew one), or not asked for: nothing runs, the manifests are not
// touched.
func TestRenewalNotDueOrOff(t *testing.T) {
	for name, e := range map[string]*renewEnv{
		"not due": newRenewEnv(t, "24h", 40*time.Hour),
		"off":     newRenewEnv(t, "", time.Hour),
	} {
		if res := e.run(); res.ExitCode != ExitOK || res.Plan.Verdict != "none" || len(e.lines()) != 0 || e.stopped {
			t.Fatalf("%s: exit %d plan %+v commands %q stopped %v", name, res.ExitCode, res.Plan, e.lines(), e.stopped)
		}
		if strings.Contains(e.logBuf.String(), EventCertRenew) {
			t.Fatalf("%s: logged a renewal", name)
		}
	}
}

// A failed renewal fails the pass within budget.certificateRenewal, says
// so (log, status, Warning Event), keeps what the node knew and restarts
// nothing; the next boot tries again.
func TestFailedRenewal(t *testing.T) {
	e := newRenewEnv(t, "72h", 40*time.Hour)
	e.fail = "/usr/bin/kubeadm certs renew"
	before := manifests(t, e.node)
	res := e.run()
	if res.ExitCode != ExitFailed || res.Status.Phase != status.PhaseFailed || res.Status.Reason != ReasonCertificateRenewalFailed {
		t.Fatalf("exit %d phase %s reason %s", res.ExitCode, res.Status.Phase, res.Status.Reason)
	}
	st := e.status(t)
	if st.NodeVersion != "v1.37.2" || st.VerifiedVersion != "v1.37.2" || st.Certificates == nil || st.Certificates.Soonest == nil || st.Certificates.Soonest.Name != "apiserver" {
		t.Fatalf("a failed renewal erased what the node knew: %+v", st)
	}
	var warned bool
	for _, ev := range st.Events {
		warned = warned || ev.Type == "Warning" && ev.Reason == status.EventCertificatesRenewalFailed
	}
	if !warned || e.stopped || !mapsEqual(manifests(t, e.node), before) {
		t.Fatalf("warned %v, stopped %v", warned, e.stopped)
	}
	e.logHas(t, "msg="+EventCertRenew, "outcome=failed", "soonest=apiserver")
	e.noSecrets(t)
}

// A pass killed while the static pods were stopped left their manifests
// parked: the next pass puts them back before it observes, and sees a
// control plane.
func TestParkedManifestsAreRestored(t *testing.T) {
	e := newRenewEnv(t, "", 300*24*time.Hour)
	before := manifests(t, e.node)
	if err := os.MkdirAll(e.node.Path(staticpods.ParkDir), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"kube-apiserver", "etcd"} {
		if err := os.Rename(e.node.Path(paths.ManifestsDir+"/"+c+".yaml"), e.node.Path(staticpods.ParkDir+"/"+c+".yaml")); err != nil {
			t.Fatal(err)
		}
	}
	res := e.run()
	if res.ExitCode != ExitOK || res.Status.Role != "init" || res.Status.Certificates == nil {
		t.Fatalf("exit %d status %+v", res.ExitCode, res.Status)
	}
	if !mapsEqual(manifests(t, e.node), before) {
		t.Fatal("manifests not restored")
	}
	e.logHas(t, "msg="+EventParkedRestored, "restored=etcd,kube-apiserver")
}
