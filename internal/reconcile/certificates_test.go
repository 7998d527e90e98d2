package reconcile

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/metrics"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// certExpiring is a PEM certificate expiring at notAfter (the real
// kubeadm's PKI is read in internal/certs; here the pass's use of it).
func certExpiring(t *testing.T, cn string, notAfter time.Time) string {
	t.Helper()
	cert, _ := testutil.ClientCertUntil(t, cn, notAfter)
	return string(cert)
}

func TestControlPlaneReportsItsCertificates(t *testing.T) {
	e := newEnv(t, "init", "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "")
	now := e.clock.Now().UTC()
	soon := now.Add(12*24*time.Hour + time.Hour).Truncate(time.Second)
	e.node.Write(paths.PKIDir+"/apiserver.crt", certExpiring(t, "kube-apiserver", soon), 0o644)
	e.node.Write(paths.PKIDir+"/etcd/server.crt", certExpiring(t, "n1", now.Add(300*24*time.Hour)), 0o644)
	e.node.Write(paths.PKIDir+"/front-proxy-ca.crt", certExpiring(t, "front-proxy-ca", now.Add(3000*24*time.Hour)), 0o644)
	if res := e.run(Steps{}); res.ExitCode != ExitOK {
		t.Fatalf("exit %d: %v", res.ExitCode, res.Err)
	}
	st := e.status(t)
	c := st.Certificates
	if c == nil || c.Soonest == nil || c.Soonest.Name != "apiserver" || c.Soonest.NotAfter != soon.Format(time.RFC3339) || c.Soonest.DaysLeft != 12 || c.Soonest.Carried {
		t.Fatalf("certificates %+v", c)
	}
	if c.SoonestCA == nil || !c.SoonestCA.CA {
		t.Fatalf("soonest CA %+v", c.SoonestCA)
	}
	// The sandbox's admin.conf names a file: kubeadm embeds its own.
	if len(c.Errors) != 1 || !strings.Contains(c.Errors[0], "admin.conf") {
		t.Fatalf("errors %q", c.Errors)
	}
	var warned bool
	for _, ev := range st.Events {
		if ev.Type == "Warning" && ev.Reason == status.EventCertificatesExpiring && strings.Contains(ev.Message, "apiserver") {
			warned = true
		}
	}
	if !warned {
		t.Fatalf("no Warning Event for a certificate 12 days from its expiry: %+v", st.Events)
	}
	a := status.Annotations(st)
	if a[status.AnnotationPrefix+status.KeyCertificateExpiry] != soon.Format(time.RFC3339) || a[status.AnnotationPrefix+status.KeyCertificateName] != "apiserver" {
		t.Fatalf("annotations %v", a)
	}
	e.logHas(t, "msg="+EventCertificates, "soonest="+soon.Format(time.RFC3339), "soonest_name=apiserver", "soonest_days=12")

	// The next pass cannot read it (a symlink planted in its place): the
	// last known expiry stays, carried, and the failure is reported.
	full := e.node.Path(paths.PKIDir + "/apiserver.crt")
	if err := os.Remove(full); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(e.node.Path(paths.PKIDir+"/etcd/server.crt"), full); err != nil {
		t.Fatal(err)
	}
	e.logBuf = &testutil.SyncBuffer{}
	if res := e.run(Steps{}); res.ExitCode != ExitOK {
		t.Fatalf("exit %d: %v", res.ExitCode, res.Err)
	}
	c = e.status(t).Certificates
	if c == nil || c.Soonest == nil || c.Soonest.Name != "apiserver" || !c.Soonest.Carried || c.Soonest.NotAfter != soon.Format(time.RFC3339) {
		t.Fatalf("a failed read erased what the node knew: %+v", c)
	}
	if len(c.Errors) != 2 || !strings.Contains(strings.Join(c.Errors, "\n"), "apiserver") {
		t.Fatalf("errors %q", c.Errors)
	}
	e.logHas(t, "msg="+EventCertificates, "level=WARN", "unread=2")
}

func TestWorkerReportsNoCertificates(t *testing.T) {
	e := newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "")
	// Certificates a worker has no business reporting are not read.
	e.node.Write(paths.PKIDir+"/apiserver.crt", certExpiring(t, "x", e.clock.Now().Add(time.Hour)), 0o644)
	if res := e.run(Steps{}); res.ExitCode != ExitOK {
		t.Fatalf("exit %d: %v", res.ExitCode, res.Err)
	}
	st := e.status(t)
	if st.Certificates != nil || len(st.Events) != 0 {
		t.Fatalf("a worker reported certificates: %+v %+v", st.Certificates, st.Events)
	}
	if strings.Contains(e.logBuf.String(), "msg="+EventCertificates) {
		t.Fatalf("a worker logged certificates:\n%s", e.logBuf.String())
	}
}

// TestPassWritesMetrics: the textfile follows the pass (a control plane's
// soonest certificate in it); providerConfig moves it or turns it off.
func TestPassWritesMetrics(t *testing.T) {
	textfile := metrics.DefaultDir + "/" + metrics.File
	e := newEnv(t, "init", "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "")
	soon := e.clock.Now().UTC().Add(40 * 24 * time.Hour).Truncate(time.Second)
	e.node.Write(paths.PKIDir+"/apiserver.crt", certExpiring(t, "kube-apiserver", soon), 0o644)
	if res := e.run(Steps{}); res.ExitCode != ExitOK {
		t.Fatalf("exit %d: %v", res.ExitCode, res.Err)
	}
	got := e.node.Read(textfile)
	for _, want := range []string{`provider_kubernetes_phase{phase="Converged"} 1`, `provider_kubernetes_outcome{outcome="converged"} 1`,
		fmt.Sprintf(`provider_kubernetes_certificate_expiry_timestamp_seconds{certificate="apiserver",ca="false"} %d`, soon.Unix()),
		"provider_kubernetes_at_pin 1"} {
		if !strings.Contains(got, want) {
			t.Fatalf("no %q in the textfile:\n%s", want, got)
		}
	}

	e.node.Write(paths.ClusterFile, e.node.Read(paths.ClusterFile)+"providerConfig:\n  metrics.textfileDir: /srv/metrics\n", 0o600)
	if res := e.run(Steps{}); res.ExitCode != ExitOK {
		t.Fatalf("exit %d: %v", res.ExitCode, res.Err)
	}
	if !strings.Contains(e.node.Read("/srv/metrics/"+metrics.File), `provider_kubernetes_phase{phase="Converged"} 1`) {
		t.Fatal("not written where providerConfig says")
	}

	e = newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "")
	e.node.Write(paths.ClusterFile, e.node.Read(paths.ClusterFile)+"providerConfig:\n  metrics.textfileDir: \"off\"\n", 0o600)
	if res := e.run(Steps{}); res.ExitCode != ExitOK {
		t.Fatalf("exit %d: %v", res.ExitCode, res.Err)
	}
	if e.node.Exists(textfile) {
		t.Fatal("written although turned off")
	}

	e = newEnv(t, "worker", "v1.37.2", "v1.37.2", "v1.37.2", "v1.37.2", "")
	e.node.Write(paths.ClusterFile, e.node.Read(paths.ClusterFile)+"providerConfig:\n  metrics.textfileDir: relative/dir\n", 0o600)
	if res := e.run(Steps{}); res.ExitCode != ExitFailed || e.status(t).Reason != ReasonConfigFailed || !strings.Contains(e.status(t).Message, metrics.Key) {
		t.Fatalf("a relative textfile directory: exit %d %+v", res.ExitCode, e.status(t))
	}
}
