package reconcile

import (
	"fmt"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/certs"
	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/status"
)

// EventCertificates is the log line of the certificate check.
const EventCertificates = "certificates"

// certificates reads when kubeadm's certificates expire, once per pass at
// its end (after an upgrade renewed them or a bootstrap wrote them), on a
// control plane only (certs.Applies). It records the soonest leaf and
// authority in the status document, logs one line, and tells a Warning
// Event when one is under certs.WarnBefore. A certificate whose read
// failed keeps its last known expiry (certs.Carry), the error is
// reported, and the others are still read.
func (p *pass) certificates(controlPlane bool) {
	if p.certsRead {
		return
	}
	p.certsRead = true
	d := &p.doc
	if !certs.Applies(d.Member, controlPlane) {
		d.Certificates = nil
		return
	}
	read, errs := certs.Read(p.Root)
	failed := make([]string, len(errs))
	for i, e := range errs {
		failed[i] = e.Name
	}
	var last []certs.Cert
	if d.Certificates != nil {
		for _, c := range d.Certificates.All {
			if t, err := time.Parse(time.RFC3339, c.NotAfter); err == nil {
				last = append(last, certs.Cert{Name: c.Name, NotAfter: t, CA: c.CA})
			}
		}
	}
	all := certs.Carry(read, failed, last)
	now := p.Now()
	shown := func(c certs.Cert) status.Certificate {
		days, _ := certs.Judge(c, now)
		return status.Certificate{Name: c.Name, NotAfter: c.NotAfter.UTC().Format(time.RFC3339), DaysLeft: days, CA: c.CA, Carried: c.Carried}
	}
	doc := &status.Certificates{}
	for _, c := range all {
		doc.All = append(doc.All, shown(c))
	}
	for _, e := range errs {
		doc.Errors = append(doc.Errors, runner.Sanitize(e.Error(), 300))
	}
	attrs := []any{}
	level := p.Log.Info
	for _, ca := range []bool{false, true} {
		c, ok := certs.Soonest(all, ca)
		if !ok {
			continue
		}
		s := shown(c)
		days, warn := certs.Judge(c, now)
		key := "soonest"
		if ca {
			doc.SoonestCA = &s
			key = "soonest_ca"
		} else {
			doc.Soonest = &s
		}
		attrs = append(attrs, key, s.NotAfter, key+"_name", c.Name, key+"_days", days)
		if warn {
			level = p.Log.Warn
			what := "certificate"
			if ca {
				what = "certificate authority"
			}
			msg := fmt.Sprintf("the %s %s expires %s (%d days left)", what, c.Name, s.NotAfter, days)
			if !ca {
				msg += ": renew with kubeadm certs renew all on this control plane, or upgrade it"
			}
			p.event("Warning", status.EventCertificatesExpiring, msg)
		}
	}
	if len(all) == 0 && len(errs) == 0 {
		attrs = append(attrs, "detail", "no certificate found")
	}
	if len(errs) > 0 {
		level = p.Log.Warn
		attrs = append(attrs, "unread", len(errs), "error", doc.Errors[0])
	}
	d.Certificates = doc
	level(EventCertificates, attrs...)
}
