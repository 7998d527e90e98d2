// Package status is the status document operators and tools read: written
// atomically to /run/provider-kubernetes/status.yaml and mirrored to
// /usr/local/provider-kubernetes/status.yaml on the persistent partition.
package status

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unicode/utf8"

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// Phases.
const (
	PhaseConverged = "Converged"
	PhaseUpgrading = "Upgrading"
	// PhaseWaiting: a control plane's pass waiting at the control-plane
	// gate for its turn (another control plane is upgrading) or for the
	// cluster to be healthy, before its kubeadm upgrade.
	PhaseWaiting       = "Waiting"
	PhaseBootstrapping = "Bootstrapping"
	PhaseRefused       = "Refused"
	PhaseFailed        = "Failed"
	PhaseReset         = "Reset"
	PhaseResetFailed   = "ResetFailed"
)

// Document is the status document. Nothing secret belongs here.
type Document struct {
	Phase       string   `json:"phase"`
	Reason      string   `json:"reason,omitempty"`
	Refusal     string   `json:"refusal,omitempty"`
	Message     string   `json:"message,omitempty"`
	Warnings    []string `json:"warnings,omitempty"`
	Role        string   `json:"role,omitempty"`
	Member      bool     `json:"member"`
	Pin         string   `json:"pin,omitempty"`
	Bundled     string   `json:"bundled,omitempty"`
	NodeVersion string   `json:"nodeVersion,omitempty"`
	// VerifiedVersion is the last version this node was verified at (the
	// provider's record, /usr/local/provider-kubernetes/verified-version).
	VerifiedVersion string   `json:"verifiedVersion,omitempty"`
	ClusterVersion  string   `json:"clusterVersion,omitempty"`
	Actions         []string `json:"actions,omitempty"`
	LastAction      string   `json:"lastAction,omitempty"`
	EtcdSnapshot    string   `json:"etcdSnapshot,omitempty"`
	// KubeadmEtcdBackups counts kubeadm's own plaintext etcd copies
	// (/etc/kubernetes/tmp/kubeadm-backup-etcd-*), when there are any.
	KubeadmEtcdBackups *Backups `json:"kubeadmEtcdBackups,omitempty"`
	// Certificates is when the certificates kubeadm manages on this
	// control plane expire (none on a worker: internal/certs.Applies).
	Certificates *Certificates `json:"certificates,omitempty"`
	Time         string        `json:"time"`
	BootID       string        `json:"bootID,omitempty"`
	// Carried names the facts this pass could not read (the API down, a
	// file unreadable) and took from the last known document instead,
	// with where from and since when they are known.
	Carried *Carried `json:"carried,omitempty"`
	// Events are what this pass has to tell on the Node (upgrade started,
	// finished or failed, a refusal); `provider-kubernetes publish` records
	// them as Kubernetes Events after the pass.
	Events []Event `json:"events,omitempty"`
}

// Carried says which facts of a document are the last known ones.
type Carried struct {
	Fields []string `json:"fields"` // e.g. member, nodeVersion
	From   string   `json:"from"`   // the document they were taken from
	Since  string   `json:"since"`  // when they were last read (UTC, RFC 3339)
}

// Event is one Kubernetes Event a pass asks to record on its Node.
type Event struct {
	Type    string `json:"type"` // Normal or Warning
	Reason  string `json:"reason"`
	Message string `json:"message"`
	Time    string `json:"time"`
}

// Event reasons.
const (
	EventUpgradeStarted  = "UpgradeStarted"
	EventUpgradeFinished = "UpgradeFinished"
	EventUpgradeFailed   = "UpgradeFailed"
)

// Certificates is the expiry of kubeadm's certificates on a control
// plane: the leaf that expires first, the authority that does, every one
// read, and what could not be read.
type Certificates struct {
	Soonest   *Certificate  `json:"soonest,omitempty"`
	SoonestCA *Certificate  `json:"soonestCA,omitempty"`
	All       []Certificate `json:"all,omitempty"`
	Errors    []string      `json:"errors,omitempty"`
}

// Certificate is one certificate's expiry, as of the document's time.
type Certificate struct {
	Name     string `json:"name"`     // kubeadm's name: apiserver, admin.conf, ca, ...
	NotAfter string `json:"notAfter"` // UTC, RFC 3339
	DaysLeft int    `json:"daysLeft"` // whole days left at the document's time, negative once expired
	CA       bool   `json:"ca,omitempty"`
	// Carried: this pass could not read it; the last known expiry.
	Carried bool `json:"carried,omitempty"`
}

// EventCertificatesExpiring is the Warning Event of a certificate under
// 30 days from its expiry.
const EventCertificatesExpiring = "CertificatesExpiring"

// Events of the opt-in certificate renewal (providerConfig
// certificates.renewBefore): Normal when kubeadm renewed the leaf
// certificates and the static pods restarted with them, Warning when
// either failed.
const (
	EventCertificatesRenewed       = "CertificatesRenewed"
	EventCertificatesRenewalFailed = "CertificatesRenewalFailed"
)

// Backups summarises kubeadm's etcd backup copies.
type Backups struct {
	Count int    `json:"count"`
	Bytes int64  `json:"bytes"`
	Dir   string `json:"dir"`
}

// MaxSize bounds a status document: Read refuses a larger one.
const MaxSize = 1 << 20

// Write writes doc to the run file and the persistent mirror, both
// atomically and 0644 (the document carries no secret). The two are
// written at once (each is fsynced, with its directory: waiting for one
// after the other doubled what a pass spent on it); every error is
// returned after both were attempted, the run file's first.
//
// Whatever it carries, the document written is this pass's: every text
// field is escaped (Printable: a DEL, a C1 control, an invalid byte or a
// line break read from the host or a peer made the YAML encoder refuse the
// whole document, and `status` then showed the previous pass's), each field
// and list is bounded, and the whole document is kept under MaxSize, the
// bound its readers (`status`, `publish`, the next pass) accept.
func Write(root paths.Root, doc Document) error {
	b, err := Marshal(doc)
	if err != nil {
		return err
	}
	files := []string{paths.StatusFile, paths.StatusMirror}
	errs := make([]error, len(files))
	var wg sync.WaitGroup
	for i, p := range files {
		wg.Go(func() {
			full := root.Path(p)
			if err := fsutil.MkdirAllMode(filepath.Dir(full), 0o755); err != nil {
				errs[i] = fmt.Errorf("status dir for %s: %w", p, err)
				return
			}
			if err := fsutil.WriteFileAtomic(full, b, 0o644); err != nil {
				errs[i] = fmt.Errorf("write status %s: %w", p, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Bounds of what a status document carries.
const (
	// MaxField bounds one text field (after escaping) of a written document.
	MaxField = 4 << 10
	// MaxItems bounds the warnings, actions and events of a written document.
	MaxItems = 64
)

// Marshal renders doc as written: escaped, each field and list bounded, the
// whole under MaxSize (fields are cut shorter until it fits).
func Marshal(doc Document) ([]byte, error) {
	for limit := MaxField; limit >= 64; limit /= 2 {
		b, err := yaml.Marshal(Bounded(doc, limit))
		if err != nil {
			return nil, fmt.Errorf("marshal status: %w", err)
		}
		if len(b) <= MaxSize {
			return b, nil
		}
	}
	return nil, fmt.Errorf("marshal status: over %d bytes even with every field cut short", MaxSize)
}

// Bounded is doc with every text field escaped (Printable) and cut to
// limit bytes, and each list cut to MaxItems entries (the last saying how
// many were left out).
func Bounded(doc Document, limit int) Document {
	f := func(s string) string { return field(s, limit) }
	list := func(in []string, what string) []string {
		if in == nil {
			return nil
		}
		out := make([]string, 0, min(len(in), MaxItems))
		for i, s := range in {
			if i == MaxItems-1 && len(in) > MaxItems {
				// The note is one of the MaxItems entries.
				out = append(out, fmt.Sprintf("(%d more %s not shown)", len(in)-i, what))
				break
			}
			out = append(out, f(s))
		}
		return out
	}
	d := doc
	d.Phase, d.Reason, d.Refusal, d.Message = f(d.Phase), f(d.Reason), f(d.Refusal), f(d.Message)
	d.Role, d.Pin, d.Bundled, d.NodeVersion = f(d.Role), f(d.Pin), f(d.Bundled), f(d.NodeVersion)
	d.VerifiedVersion, d.ClusterVersion, d.LastAction = f(d.VerifiedVersion), f(d.ClusterVersion), f(d.LastAction)
	d.EtcdSnapshot, d.Time, d.BootID = f(d.EtcdSnapshot), f(d.Time), f(d.BootID)
	d.Warnings = list(d.Warnings, "warnings")
	d.Actions = list(d.Actions, "actions")
	if b := d.KubeadmEtcdBackups; b != nil {
		c := *b
		c.Dir = f(c.Dir)
		d.KubeadmEtcdBackups = &c
	}
	if c := d.Certificates; c != nil {
		cert := func(x Certificate) Certificate {
			x.Name, x.NotAfter = f(x.Name), f(x.NotAfter)
			return x
		}
		n := &Certificates{Errors: list(c.Errors, "errors")}
		if c.Soonest != nil {
			s := cert(*c.Soonest)
			n.Soonest = &s
		}
		if c.SoonestCA != nil {
			s := cert(*c.SoonestCA)
			n.SoonestCA = &s
		}
		for i, x := range c.All {
			if i == MaxItems {
				break
			}
			n.All = append(n.All, cert(x))
		}
		d.Certificates = n
	}
	if c := d.Carried; c != nil {
		d.Carried = &Carried{Fields: list(c.Fields, "fields"), From: f(c.From), Since: f(c.Since)}
	}
	if d.Events != nil {
		evs := d.Events
		if len(evs) > MaxItems {
			evs = evs[len(evs)-MaxItems:] // the latest
		}
		d.Events = make([]Event, len(evs))
		for i, e := range evs {
			d.Events[i] = Event{Type: f(e.Type), Reason: f(e.Reason), Message: f(e.Message), Time: f(e.Time)}
		}
	}
	return d
}

// field escapes s and cuts it to limit bytes, on a character boundary,
// saying how long it was.
func field(s string, limit int) string {
	orig := len(s)
	if len(s) > 4*limit {
		// Escaping never shortens: escape only what can be kept.
		s = s[:4*limit]
	}
	e := Printable(s)
	if len(e) <= limit {
		return e
	}
	cut := limit - 40
	for cut > 0 && !utf8.RuneStart(e[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (cut, %d bytes)", e[:cut], orig)
}

// Read reads a status document from a host path under root.
func Read(root paths.Root, p string) (Document, error) {
	b, err := fsutil.ReadFileNoFollow(root.Path(p), MaxSize)
	if err != nil {
		return Document{}, err
	}
	return parse(b, p)
}

// ReadTrusted reads a status document the provider acts on (the mirror's
// last known facts): like Read, but only when the file and every directory
// above it up to root are root's own and writable by nobody else
// (fsutil.ReadFileTrusted).
func ReadTrusted(root paths.Root, p string) (Document, error) {
	b, err := fsutil.ReadFileTrusted(string(root), p, MaxSize)
	if err != nil {
		return Document{}, err
	}
	return parse(b, p)
}

func parse(b []byte, p string) (Document, error) {
	var d Document
	if err := yaml.Unmarshal(b, &d); err != nil {
		return Document{}, fmt.Errorf("parse %s: %w", p, err)
	}
	return d, nil
}

// Print renders doc for a person ("text": every value through Printable,
// so nothing read from the file can inject a line or a terminal escape),
// or as yaml or json for tools.
func Print(w io.Writer, doc Document, format string) error {
	switch format {
	case "yaml":
		b, err := yaml.Marshal(doc)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	case "json":
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(doc)
	case "", "text":
	default:
		return fmt.Errorf("unknown output format %q: want text, yaml or json", format)
	}
	var sb strings.Builder
	line := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&sb, "%-16s %s\n", k+":", Printable(v))
		}
	}
	line("Phase", doc.Phase)
	line("Reason", doc.Reason)
	line("Refusal", doc.Refusal)
	line("Message", doc.Message)
	line("Role", doc.Role)
	line("Member", fmt.Sprint(doc.Member))
	line("Pin", doc.Pin)
	line("Bundled kubeadm", doc.Bundled)
	line("Node version", doc.NodeVersion)
	line("Cluster version", doc.ClusterVersion)
	line("Planned actions", strings.Join(doc.Actions, ", "))
	line("Last action", doc.LastAction)
	line("etcd snapshot", doc.EtcdSnapshot)
	if b := doc.KubeadmEtcdBackups; b != nil {
		line("kubeadm backups", fmt.Sprintf("%d etcd copies, %s, in %s", b.Count, HumanBytes(b.Bytes), b.Dir))
	}
	if c := doc.Certificates; c != nil {
		for _, x := range []struct {
			k string
			c *Certificate
		}{{"Certificates", c.Soonest}, {"Certificate CA", c.SoonestCA}} {
			if x.c != nil {
				line(x.k, fmt.Sprintf("%s expires first, %s (%d days left)", x.c.Name, x.c.NotAfter, x.c.DaysLeft))
			}
		}
		for _, e := range c.Errors {
			line("Certificate", e)
		}
	}
	for _, w := range doc.Warnings {
		line("Warning", w)
	}
	if c := doc.Carried; c != nil {
		line("Carried", fmt.Sprintf("%s: last known, from %s (read %s)", strings.Join(c.Fields, ", "), c.From, c.Since))
	}
	line("Time", doc.Time)
	line("Boot ID", doc.BootID)
	_, err := io.WriteString(w, sb.String())
	return err
}

// HumanBytes renders a size for people ("1.5 GiB").
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

// ErrNoStatus is returned when no status document exists yet.
var ErrNoStatus = errors.New("no status document yet: the reconcile pass has not run on this boot")

// ReadCurrent reads the run file, falling back to the persistent mirror.
func ReadCurrent(root paths.Root) (Document, string, error) {
	for _, p := range []string{paths.StatusFile, paths.StatusMirror} {
		d, err := Read(root, p)
		if err == nil {
			return d, p, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return Document{}, p, err
		}
	}
	return Document{}, "", ErrNoStatus
}
