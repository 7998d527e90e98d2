package status

import (
	"regexp"
	"unicode/utf8"

	"github.com/kairos-io/provider-kubernetes/internal/runner"
)

// AnnotationPrefix starts every annotation the provider writes on a Node:
// the status document as other nodes and tools read it from the API
// (`provider-kubernetes publish` after every pass, the control-plane gate
// during one, `status --cluster` and the gate reading them back).
const AnnotationPrefix = "provider-kubernetes.kairos.io/"

// Annotation keys (after AnnotationPrefix).
const (
	KeyPhase           = "phase"
	KeyOutcome         = "outcome"
	KeyRole            = "role"
	KeyNodeVersion     = "node-version"
	KeyVerifiedVersion = "verified-version"
	KeyPin             = "pin"
	KeyBundled         = "bundled"
	KeyClusterVersion  = "cluster-version"
	KeyRefusal         = "refusal"
	KeyReason          = "reason"
	KeyMessage         = "message"
	KeyLastAction      = "last-action"
	KeyTime            = "time"
	KeyBootID          = "boot-id"
	// KeyCertificateExpiry and KeyCertificateName: when the leaf
	// certificate of a control plane that expires first does (UTC, RFC
	// 3339) and kubeadm's name for it; empty on a worker.
	KeyCertificateExpiry = "certificate-expiry"
	KeyCertificateName   = "certificate-name"
)

// MaxAnnotationMessage bounds the message annotation.
const MaxAnnotationMessage = 500

// NodeMessage is the document's message as a Node carries it (the message
// annotation, the KubernetesUpgrade condition's message): escaped, secrets
// masked, at most MaxAnnotationMessage bytes, "..." included when it is
// cut (Sanitize adds its "..." past the bound), never inside a character.
func NodeMessage(d Document) string {
	s := runner.Sanitize(Printable(d.Message), MaxAnnotationMessage)
	if len(s) <= MaxAnnotationMessage {
		return s
	}
	cut := MaxAnnotationMessage - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// Annotations is the document as a Node's annotations: every key is always
// set (empty when the document has no value), so a refusal of an earlier
// pass does not linger after a converged one.
func Annotations(d Document) map[string]string {
	outcome := map[string]string{
		PhaseConverged: "converged", PhaseRefused: "refused", PhaseFailed: "failed",
		PhaseUpgrading: "running", PhaseWaiting: "running", PhaseBootstrapping: "running",
	}[d.Phase]
	m := map[string]string{
		KeyPhase: d.Phase, KeyOutcome: outcome, KeyRole: d.Role, KeyNodeVersion: d.NodeVersion,
		KeyVerifiedVersion: d.VerifiedVersion, KeyPin: d.Pin, KeyBundled: d.Bundled, KeyClusterVersion: d.ClusterVersion,
		KeyRefusal: d.Refusal, KeyReason: d.Reason, KeyMessage: NodeMessage(d),
		KeyLastAction: d.LastAction, KeyTime: d.Time, KeyBootID: d.BootID,
	}
	m[KeyCertificateExpiry], m[KeyCertificateName] = "", ""
	if c := d.Certificates; c != nil && c.Soonest != nil {
		m[KeyCertificateExpiry], m[KeyCertificateName] = Printable(c.Soonest.NotAfter), Printable(c.Soonest.Name)
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[AnnotationPrefix+k] = v
	}
	return out
}

// codeRE is a reason or refusal code as Kubernetes writes reasons: one
// CamelCase word.
var codeRE = regexp.MustCompile(`^[A-Z][A-Za-z0-9]{0,127}$`)

// IsCode reports whether s is a reason or refusal code (one CamelCase
// word): what a peer published under KeyReason or KeyRefusal is repeated
// only when it is one.
func IsCode(s string) bool { return codeRE.MatchString(s) }
