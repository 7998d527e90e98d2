// Package metrics writes the node's last pass as a node_exporter textfile
// (Prometheus text exposition format): the phase, the outcome and its
// time, a control plane's soonest certificate expiry, and whether the node
// runs its pin. The reconcile pass writes it with every status document,
// publish again after it; both atomically, into a directory that is
// root's own and writable by nobody else.
package metrics

import (
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// DefaultDir is node_exporter's usual --collector.textfile.directory.
const DefaultDir = "/var/lib/node_exporter/textfile_collector"

// File is the textfile's name in its directory.
const File = "provider_kubernetes.prom"

// Key is the providerConfig key that moves the textfile's directory, or
// with Off turns it off.
const (
	Key = "metrics.textfileDir"
	Off = "off"
)

// maxDir bounds the directory a providerConfig names.
const maxDir = 256

// Dir is the textfile directory providerConfig asks for: DefaultDir when
// it names none, "" when it turns the textfile off. A value that is not
// an absolute clean path of plain characters (or off) is an error naming
// the key, never quoting the value.
func Dir(providerConfig map[string]string) (string, error) {
	v, ok := providerConfig[Key]
	if !ok {
		return DefaultDir, nil
	}
	v = strings.TrimSpace(v)
	if v == Off {
		return "", nil
	}
	plain := strings.IndexFunc(v, func(r rune) bool { return r < 0x21 || r > 0x7e }) < 0
	if v == "" || len(v) > maxDir || !plain || !path.IsAbs(v) || path.Clean(v) != v || v == "/" {
		return "", fmt.Errorf("providerConfig %s is not %s nor an absolute clean directory path of at most %d plain characters (e.g. %s)", Key, Off, maxDir, DefaultDir)
	}
	return v, nil
}

// Phases every textfile lists (the one the node is in 1, the others 0).
var phases = []string{status.PhaseBootstrapping, status.PhaseConverged, status.PhaseFailed, status.PhaseRefused,
	status.PhaseReset, status.PhaseResetFailed, status.PhaseUpgrading, status.PhaseWaiting, "EtcdRestored"}

// outcomes as the outcome annotation names them.
var outcomes = []string{"converged", "failed", "refused", "running"}

// Render is the textfile of a status document.
func Render(d status.Document) []byte {
	var b strings.Builder
	family := func(name, typ, help string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	bit := func(ok bool) int {
		if ok {
			return 1
		}
		return 0
	}
	const phase = "provider_kubernetes_phase"
	family(phase, "gauge", "The phase of the node's last reconcile pass: 1 for the phase it is in, 0 for the others.")
	ps := phases
	if !slices.Contains(ps, d.Phase) && d.Phase != "" {
		ps = append(slices.Clone(ps), d.Phase)
	}
	for _, p := range ps {
		fmt.Fprintf(&b, "%s{phase=\"%s\"} %d\n", phase, escape(p), bit(p == d.Phase))
	}
	const outcome = "provider_kubernetes_outcome"
	family(outcome, "gauge", "The outcome of the node's last reconcile pass (converged, refused, failed, or running while it acts): 1 for its outcome, 0 for the others.")
	out := status.Annotations(d)[status.AnnotationPrefix+status.KeyOutcome]
	for _, o := range outcomes {
		fmt.Fprintf(&b, "%s{outcome=\"%s\"} %d\n", outcome, o, bit(o == out))
	}
	if t, err := time.Parse(time.RFC3339, d.Time); err == nil {
		const at = "provider_kubernetes_outcome_timestamp_seconds"
		family(at, "gauge", "When the node's last reconcile pass wrote its outcome (Unix seconds).")
		fmt.Fprintf(&b, "%s %d\n", at, t.Unix())
	}
	if c := d.Certificates; c != nil {
		const exp = "provider_kubernetes_certificate_expiry_timestamp_seconds"
		var lines []string
		for _, x := range []*status.Certificate{c.Soonest, c.SoonestCA} {
			if x == nil {
				continue
			}
			if t, err := time.Parse(time.RFC3339, x.NotAfter); err == nil {
				lines = append(lines, fmt.Sprintf("%s{certificate=\"%s\",ca=\"%t\"} %d\n", exp, escape(x.Name), x.CA, t.Unix()))
			}
		}
		if len(lines) > 0 {
			family(exp, "gauge", "When the control plane's kubeadm certificate that expires first does (Unix seconds): the soonest leaf (ca=\"false\") and the soonest authority (ca=\"true\").")
			b.WriteString(strings.Join(lines, ""))
		}
	}
	const atPin = "provider_kubernetes_at_pin"
	family(atPin, "gauge", "1 when the node runs the version its pin asks (its node version equals the pin), 0 otherwise.")
	pin, perr := version.Parse(d.Pin)
	node, nerr := version.Parse(d.NodeVersion)
	fmt.Fprintf(&b, "%s %d\n", atPin, bit(perr == nil && nerr == nil && pin == node))
	return []byte(b.String())
}

// escape is a label value as the exposition format writes it.
func escape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(status.Printable(s))
}

// Write writes d's textfile as File in dir under root: the directory made
// when missing (0755, never through a symlink), refused when it is not
// root's own or is writable by group or others (whoever could write there
// could swap what node_exporter serves), the file 0644, atomically.
// dir "" (turned off) writes nothing.
func Write(root paths.Root, dir string, d status.Document) error {
	if dir == "" {
		return nil
	}
	r := string(root)
	if r == "" {
		r = "/"
	}
	h, err := fsutil.MkdirAllBeneath(r, dir, 0o755)
	if err != nil {
		return fmt.Errorf("metrics directory %s: %w", dir, err)
	}
	defer h.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(h.Fd()), &st); err != nil {
		return &os.PathError{Op: "fstat", Path: dir, Err: err}
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return fmt.Errorf("metrics directory %s is owned by uid %d with mode %04o: not written (it must be root's own and writable by nobody else)", dir, st.Uid, st.Mode&0o7777)
	}
	if err := fsutil.WriteFileAtomicAt(h, File, Render(d), 0o644); err != nil {
		return fmt.Errorf("metrics %s/%s: %w", dir, File, err)
	}
	return nil
}
