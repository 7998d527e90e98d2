package reconcile

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/certs"
	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/health"
	"github.com/kairos-io/provider-kubernetes/internal/observe"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/staticpods"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
)

// Log events of the certificate renewal.
const (
	// EventCertRenew is the one line of a kubeadm certs renew all.
	EventCertRenew = "cert-renew"
	// EventParkedRestored: a pass put back the manifests a killed pass
	// had moved out to restart the static pods.
	EventParkedRestored = "parked-manifests-restored"
)

// Failure reasons of the renewal.
const (
	ReasonCertificateRenewalFailed  = "CertificateRenewalFailed"
	ReasonControlPlaneRestartFailed = "ControlPlaneRestartFailed"
)

// RenewCertificates renews kubeadm's certificates through the runner: the
// bundled kubeadm's `certs renew all --config` with the configuration
// certs.RenewConfig renders, bounded by budget.certificateRenewal. It
// logs one cert-renew line and returns the soonest leaf before and
// after. kubeadm succeeding while the soonest leaf did not move (an
// external CA, whose leaves kubeadm cannot sign) is a failure.
func (p *pass) renewCertificates(ctx context.Context, obs Observation, pl plan.Plan) error {
	start := p.Clock.Now()
	before, _ := certs.Read(p.Root)
	old, _ := certs.Soonest(before, false)
	attrs := []any{"outcome", "ok", "renew_before", obs.Facts.Certificates.RenewBefore.String(), "soonest", old.Name,
		"not_after_before", old.NotAfter.UTC().Format(time.RFC3339)}
	err := p.runRenewal(ctx, obs, pl)
	var now certs.Cert
	if err == nil {
		after, _ := certs.Read(p.Root)
		var ok bool
		if now, ok = certs.Soonest(after, false); !ok || !now.NotAfter.After(old.NotAfter) {
			err = fmt.Errorf("kubeadm certs renew all succeeded but the soonest leaf certificate, %s, still expires %s (an external CA kubeadm cannot sign with?): see %s",
				old.Name, old.NotAfter.UTC().Format(time.RFC3339), paths.KubeadmLog)
		}
	}
	attrs = append(attrs, "duration", p.Clock.Now().Sub(start).Round(time.Millisecond).String())
	if err != nil {
		attrs[1] = "failed"
		p.Log.Error(EventCertRenew, append(attrs, "error", runner.Sanitize(err.Error(), 400))...)
		return err
	}
	p.renewed = fmt.Sprintf("renewed kubeadm's leaf certificates: the soonest, %s, now expires %s (was %s)",
		now.Name, now.NotAfter.UTC().Format(time.RFC3339), old.NotAfter.UTC().Format(time.RFC3339))
	p.Log.Info(EventCertRenew, append(attrs, "soonest_after", now.Name, "not_after", now.NotAfter.UTC().Format(time.RFC3339))...)
	return nil
}

func (p *pass) runRenewal(ctx context.Context, obs Observation, pl plan.Plan) error {
	name := ""
	if obs.Client != nil {
		name = obs.Client.NodeName
	}
	cfg, err := certs.RenewConfig(obs.Config.Kubeadm, pl.Pin, p.Root, name)
	if err != nil {
		return err
	}
	full := p.Root.Path(certs.RenewConfigPath)
	remove, err := fsutil.WriteScratchBeneath(p.Root.Path("/"), certs.RenewConfigPath, cfg)
	if err != nil {
		return err
	}
	defer remove()
	ctx, cancel := context.WithTimeout(ctx, p.Budgets.CertificateRenewal)
	defer cancel()
	cmd := runner.Cmd{Path: paths.Kubeadm, Args: certs.RenewArgs(full)}
	res, err := p.Runner.Run(ctx, cmd)
	p.keepOutput(cmd, res, err)
	return err
}

// restartControlPlane restarts this control plane's static pods after a
// renewal (staticpods.Restarter), bounded by budget.localAPI: the pass
// runs beside the kubelet, which may have started them with the old
// certificates before the renewal (see the reconcile unit: it is not
// ordered before kubelet.service).
func (p *pass) restartControlPlane(ctx context.Context) error {
	ready := p.LocalAPIReady
	if ready == nil {
		ready = p.localAPIServesRenewed
	}
	r := &staticpods.Restarter{Root: p.Root, Clock: p.Clock, Ready: ready, Budget: p.Budgets.LocalAPI, Listening: p.Listening}
	_, err := r.Restart(ctx)
	return err
}

// localAPIServesRenewed is one attempt at "the local apiserver is back
// with its renewed certificate": /readyz answers (trusting only the
// cluster CA) and the certificate it serves is the one on disk now.
func (p *pass) localAPIServesRenewed(ctx context.Context) error {
	ca, err := fsutil.ReadFileNoFollow(p.Root.Path(paths.CACert), 1<<20)
	if err != nil {
		return fmt.Errorf("cluster CA: %w", err)
	}
	port := 6443
	if b, err := observe.ReadManifest(p.Root.Path(paths.APIServerManifest)); err == nil {
		if ps := staticpods.Ports("kube-apiserver", b); len(ps) > 0 {
			port = ps[0]
		}
	}
	hostport := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := (health.Prober{}).Readyz(ctx, hostport, health.APIServerName, ca); err != nil {
		return err
	}
	onDisk, errs := certs.Read(p.Root)
	var want time.Time
	for _, c := range onDisk {
		if c.Name == "apiserver" {
			want = c.NotAfter
		}
	}
	if want.IsZero() {
		return fmt.Errorf("the apiserver certificate on disk could not be read: %v", errs)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	d := tls.Dialer{Config: &tls.Config{RootCAs: pool, ServerName: health.APIServerName, MinVersion: tls.VersionTLS12}}
	conn, err := d.DialContext(ctx, "tcp", hostport)
	if err != nil {
		return err
	}
	defer conn.Close()
	chain := conn.(*tls.Conn).ConnectionState().PeerCertificates
	if len(chain) == 0 || !chain[0].NotAfter.Equal(want) {
		return errors.New("the apiserver still serves its certificate from before the renewal")
	}
	return nil
}

// restoreParked puts back the manifests a killed pass left parked, before
// anything is observed (a control plane is told by its apiserver
// manifest); one line when it did something or failed.
func (p *pass) restoreParked() {
	restored, err := staticpods.RestoreParked(p.Root)
	if len(restored) == 0 && err == nil {
		return
	}
	attrs := []any{"outcome", "ok", "restored", strings.Join(restored, ",")}
	if err != nil {
		attrs[1] = "failed"
		p.Log.Error(EventParkedRestored, append(attrs, "error", runner.Sanitize(err.Error(), 400))...)
		return
	}
	p.Log.Warn(EventParkedRestored, attrs...)
}

// renewalEvent is the Event of a renewal plan's outcome: Normal
// CertificatesRenewed, or Warning CertificatesRenewalFailed.
func (p *pass) renewalEvent(pl plan.Plan, failed error) {
	if !pl.Has(plan.ActionRenewCertificates) {
		return
	}
	if failed != nil {
		p.event("Warning", status.EventCertificatesRenewalFailed, "kubeadm's certificates were not renewed and restarted: "+failed.Error()+
			" (the next boot tries again; kubeadm certs renew all by hand, then restart the static pods, is the way out)")
		return
	}
	p.event("Normal", status.EventCertificatesRenewed, p.renewed+"; the control-plane static pods restarted with them")
}
