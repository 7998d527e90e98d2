package testbin

import "os"

// DebianSuite is the Debian release every node base is built from: the
// end-to-end nodes' (tests/e2e/harness) and the Kairos image's
// (internal/kairosimage).
const DebianSuite = "bookworm"

// DebianMirror is where debootstrap and apt get Debian's packages for
// those bases: $PROVIDER_KUBERNETES_E2E_MIRROR, else deb.debian.org.
func DebianMirror() string {
	if m := os.Getenv("PROVIDER_KUBERNETES_E2E_MIRROR"); m != "" {
		return m
	}
	return "http://deb.debian.org/debian"
}
