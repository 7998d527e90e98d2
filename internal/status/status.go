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

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// Phases.
const (
	PhaseConverged     = "Converged"
	PhaseUpgrading     = "Upgrading"
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
	Time               string   `json:"time"`
	BootID             string   `json:"bootID,omitempty"`
	// Events are what this pass has to tell on the Node (upgrade started,
	// finished or failed, a refusal); `provider-kubernetes publish` records
	// them as Kubernetes Events after the pass.
	Events []Event `json:"events,omitempty"`
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
func Write(root paths.Root, doc Document) error {
	b, err := yaml.Marshal(doc)
	if err != nil {
		return fmt.Errorf("marshal status: %w", err)
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
	for _, w := range doc.Warnings {
		line("Warning", w)
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
