package reconcile

import (
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/pkg/plan"
)

// TestOSRollbackOfANodeAtThePinIsRefused: a node already at the pin that
// boots an image a minor older (the other A/B slot) is refused
// PinNewerThanImage: exit 3, nothing run, the status names the rollback.
// Before, it was reported converged with a warning and exit 0.
func TestOSRollbackOfANodeAtThePinIsRefused(t *testing.T) {
	for _, role := range []string{"controlplane", "worker"} {
		t.Run(role, func(t *testing.T) {
			e := newEnv(t, role, "v1.37.2", "v1.36.3", "v1.37.2", "v1.37.2", "")
			res := e.run(Steps{})
			if res.ExitCode != ExitRefused || res.Plan.Refusal != plan.PinNewerThanImage {
				t.Fatalf("exit %d plan %+v", res.ExitCode, res.Plan)
			}
			if len(e.lines()) != 0 {
				t.Fatalf("ran %q", e.lines())
			}
			st := e.status(t)
			if st.Phase != status.PhaseRefused || st.Refusal != string(plan.PinNewerThanImage) || st.Reason != plan.ReasonUpgradeRefused ||
				!strings.Contains(st.Message, "OS rollback") || !strings.Contains(st.Message, "boot the image for 1.37") {
				t.Fatalf("status %+v", st)
			}
			e.logHas(t, "msg="+EventRefuseUpgrade, "code=PinNewerThanImage")
		})
	}
}
