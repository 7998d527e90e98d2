package e2e

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/oci"
	"github.com/kairos-io/provider-kubernetes/tests/e2e/harness"
)

// The reboot of a kairos-operator rollout, run as the operator runs it.
//
// The module proxy does not serve github.com/kairos-io/kairos-operator (403
// for every tag and commit), so the operator itself cannot be built here
// (issue 27 item 7). What decides whether a rollout moves on is not the
// controller, though: it counts a node rebooted when the node's reboot Pod
// has ended Succeeded with the annotation kairos.io/reboot-state=completed
// (isRebootPodCompleted, internal/controller/nodeop_controller.go of
// v0.1.3), and that Pod's fate is the kubelet's, on a node whose
// KubeletConfiguration the provider renders with graceful node shutdown
// (the kubelet marks the pods it stops for a shutdown Failed). So the
// single control plane's upgrade reboot is done by that Pod, exactly as
// createRebootPod writes it: its script verbatim, hostPID, privileged,
// root, the sentinel directory from the host, restartPolicy OnFailure, its
// ServiceAccount and ClusterRole. What stands in: the image (the real one is
// alpine with kubectl and busybox, pulled from quay.io; this one is
// Debian's static busybox, dash, util-linux's nsenter and the tree's kubectl,
// built with the project's OCI code) and the Job's sentinel container (the
// test writes its file).

// operatorRebootJob is the Job name the Pod waits for a sentinel of.
const (
	operatorRebootJob   = "pk-upgrade-cp1-x7k2q"
	operatorRebootPod   = "pk-upgrade-reboot-e2e"
	operatorRebootImage = "localhost/pk-e2e/kairos-operator-reboot:v0.1.3"
	operatorRebootState = "kairos.io/reboot-state"
)

// operatorRebootScript is createRebootPod's script (kairos-operator
// v0.1.3, 554c054, internal/controller/nodeop_controller.go), with
// rebootStatusCompleted ("completed") and the Job name filled in.
func operatorRebootScript(jobName string) string {
	return `echo "=== Checking for existing reboot annotation ==="
EXISTING_ANNOTATION=$(kubectl get pod $POD_NAME --namespace $POD_NAMESPACE -o jsonpath='{.metadata.annotations.kairos\.io/reboot-state}' 2>/dev/null || echo "")
if [ "$EXISTING_ANNOTATION" = "completed" ]; then
	echo "Reboot annotation already exists, reboot was already performed. Exiting successfully."
	exit 0
fi
echo "No reboot annotation found, proceeding with reboot process..."

ls -la /sentinel/ || echo "Cannot list /sentinel directory"

# Watch only for THIS Job's sentinel (` + jobName + `-*). Stale sentinels left by
# previous runs use different Job names and can't match.
while true; do
	SENTINEL_FILE=$(find /sentinel -name "` + jobName + `-*" -type f 2>/dev/null | head -1)
	if [ -n "$SENTINEL_FILE" ]; then
		echo "Found sentinel file: $SENTINEL_FILE"
		echo "Deleting sentinel file before reboot..."
		rm -f "$SENTINEL_FILE"
		echo "Attempting to patch pod..."
		kubectl patch pod $POD_NAME -p '{"metadata":{"annotations":{"kairos.io/reboot-state":"completed"}}}' --namespace $POD_NAMESPACE || echo "kubectl patch failed"
		echo "Giving 5 seconds to the Job Pod to exit gracefully..."
		sleep 5
		echo "Attempting reboot with nsenter..."
		nsenter -i -m -t 1 -- reboot || echo "nsenter reboot failed"
		break
	fi
	echo "No matching sentinel file found, sleeping..."
	sleep 10
done`
}

// operatorRebootObjects are the Pod, its ServiceAccount and the
// ClusterRole the operator creates for it (ensureNodeOpServiceAccount,
// ensureRebootClusterRole), as one List.
func operatorRebootObjects() []byte {
	type m = map[string]any
	fieldEnv := func(name, path string) m {
		return m{"name": name, "valueFrom": m{"fieldRef": m{"fieldPath": path}}}
	}
	objs := []m{
		{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": m{"name": "pk-upgrade-reboot", "namespace": "default"}},
		{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": m{"name": "nodeop-reboot"},
			"rules": []m{{"apiGroups": []string{""}, "resources": []string{"pods"}, "verbs": []string{"get", "patch"}}}},
		{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": m{"name": "nodeop-reboot-pk-upgrade"},
			"roleRef":  m{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "nodeop-reboot"},
			"subjects": []m{{"kind": "ServiceAccount", "name": "pk-upgrade-reboot", "namespace": "default"}}},
		{"apiVersion": "v1", "kind": "Pod",
			"metadata": m{"name": operatorRebootPod, "namespace": "default",
				"labels": m{"kairos.io/nodeop": "pk-upgrade", "kairos.io/reboot": "true", "kairos.io/node": "cp1"}},
			"spec": m{
				"nodeName": "cp1",
				"hostPID":  true,
				"containers": []m{{
					"name":            "reboot",
					"image":           operatorRebootImage,
					"command":         []string{"/bin/sh", "-c", operatorRebootScript(operatorRebootJob)},
					"securityContext": m{"privileged": true, "runAsUser": 0},
					"env":             []m{fieldEnv("POD_NAME", "metadata.name"), fieldEnv("POD_NAMESPACE", "metadata.namespace")},
					"volumeMounts":    []m{{"name": "sentinel", "mountPath": "/sentinel"}},
				}},
				"volumes":            []m{{"name": "sentinel", "hostPath": m{"path": "/usr/local/.kairos", "type": "Directory"}}},
				"restartPolicy":      "OnFailure",
				"serviceAccountName": "pk-upgrade-reboot",
			}},
	}
	b, err := json.Marshal(m{"apiVersion": "v1", "kind": "List", "items": objs})
	if err != nil {
		panic(err)
	}
	return b
}

// startOperatorRebootPod imports the stand-in image into n's containerd,
// creates the reboot Pod and its RBAC, and waits until it runs (watching
// for the sentinel). tree is n's OS tree (its kubectl goes into the image).
func startOperatorRebootPod(t testing.TB, n *harness.Node, tree string) {
	t.Helper()
	tarball := filepath.Join(t.TempDir(), "reboot.tar")
	entries := []oci.Entry{
		{Path: "bin/busybox", Source: "/bin/busybox", Mode: 0o755},
		{Path: "usr/bin/kubectl", Source: filepath.Join(tree, "usr/bin/kubectl"), Mode: 0o755},
		{Path: "tmp", Type: tar.TypeDir, Mode: 0o1777},
	}
	for _, a := range []string{"ls", "find", "head", "rm", "sleep", "echo", "cat"} {
		entries = append(entries, oci.Entry{Path: "bin/" + a, Type: tar.TypeSymlink, Linkname: "busybox"})
	}
	// The shell is dash and nsenter util-linux's, with their libraries:
	// Debian's busybox runs its own applet for a bare command name (its ash
	// and its nsenter: CONFIG_FEATURE_SH_STANDALONE, _PREFER_APPLETS), so
	// `nsenter ... -- reboot` would run busybox's reboot, which only
	// signals PID 1 (SIGTERM: systemd re-executes itself, nothing reboots;
	// the first runs of this test showed it). With these, as in the real
	// image, nsenter runs the host's /usr/sbin/reboot in its mount namespace.
	for p, src := range map[string]string{
		"bin/sh":                               "/bin/dash",
		"usr/bin/nsenter":                      "/usr/bin/nsenter",
		"lib64/ld-linux-x86-64.so.2":           "/lib64/ld-linux-x86-64.so.2",
		"lib/x86_64-linux-gnu/libc.so.6":       "/lib/x86_64-linux-gnu/libc.so.6",
		"lib/x86_64-linux-gnu/libselinux.so.1": "/lib/x86_64-linux-gnu/libselinux.so.1",
		"lib/x86_64-linux-gnu/libpcre2-8.so.0": "/lib/x86_64-linux-gnu/libpcre2-8.so.0",
	} {
		real, err := filepath.EvalSymlinks(src)
		if err != nil {
			t.Fatalf("the reboot image needs the host's %s (util-linux's nsenter and its libraries): %v", src, err)
		}
		entries = append(entries, oci.Entry{Path: p, Source: real, Mode: 0o755})
	}
	if _, err := oci.WriteFile(tarball, oci.Image{Ref: operatorRebootImage, Entries: entries,
		Config: oci.Config{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(tarball)
	if err != nil {
		t.Fatal(err)
	}
	for p, data := range map[string][]byte{"/root/pk-operator-reboot.tar": b, "/root/pk-operator-reboot.json": operatorRebootObjects()} {
		if err := n.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"ctr", "-n", "k8s.io", "images", "import", "/root/pk-operator-reboot.tar"},
		{"mkdir", "-p", "/usr/local/.kairos"}, // the Job's sentinel container creates it (DirectoryOrCreate)
	} {
		if out, err := n.Output(ctx, args...); err != nil {
			t.Fatalf("%v on %s: %v\n%s", args, n.Name, err, out)
		}
	}
	kubectl(t, n, "apply", "-f", "/root/pk-operator-reboot.json")
	kubectl(t, n, "wait", "--for=condition=Ready", "pod/"+operatorRebootPod, "--timeout=2m")
}

// rebootByOperator does what the Job's sentinel container does when the
// upgrade Job ends (a file named after the Job in /usr/local/.kairos) and
// waits until the node has gone down by itself, rebooted by the Pod. It
// returns how long that took.
func rebootByOperator(t testing.TB, n *harness.Node) time.Duration {
	t.Helper()
	start := time.Now()
	sentinel := fmt.Sprintf("/usr/local/.kairos/%s-%d", operatorRebootJob, start.Unix())
	if err := n.WriteFile(sentinel, []byte("Job completed at "+start.UTC().Format(time.UnixDate)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := n.WaitExit(ctx, 3*time.Minute); err != nil {
		t.Fatalf("the operator's reboot Pod did not take the node down: %v\n%s", err, kubectlLogs(n, operatorRebootPod))
	}
	return time.Since(start)
}

// operatorCountedRebooted asserts, after the node's next boot, what the
// operator reads to count the node rebooted and move on: the reboot Pod
// Succeeded with the annotation. It logs when the Pod's container ended
// against when the kubelet's graceful shutdown began.
func operatorCountedRebooted(t testing.TB, n *harness.Node) {
	t.Helper()
	var pod struct {
		Metadata struct{ Annotations map[string]string }
		Status   struct {
			Phase, Reason, Message string
			ContainerStatuses      []struct {
				RestartCount int
				State        struct {
					Terminated *struct {
						ExitCode   int
						Reason     string
						FinishedAt time.Time
					}
				}
			}
		}
	}
	out := kubectl(t, n, "get", "pod", operatorRebootPod, "-o", "json")
	if err := json.Unmarshal(out, &pod); err != nil {
		t.Fatalf("the reboot Pod: %v\n%s", err, out)
	}
	shut := gracefulShutdown(t, n)
	ended := "never"
	if cs := pod.Status.ContainerStatuses; len(cs) == 1 && cs[0].State.Terminated != nil {
		tm := cs[0].State.Terminated
		ended = fmt.Sprintf("exit %d (%s) at %s, %s after the kubelet's shutdown began, restarts %d",
			tm.ExitCode, tm.Reason, tm.FinishedAt.UTC().Format(time.TimeOnly), tm.FinishedAt.Sub(shut.StartTime).Round(time.Second), cs[0].RestartCount)
	}
	t.Logf("kairos-operator's reboot Pod after the reboot: phase %s (%s %s), %s=%q, its container: %s; the kubelet's graceful shutdown %s to %s",
		pod.Status.Phase, pod.Status.Reason, pod.Status.Message, operatorRebootState, pod.Metadata.Annotations[operatorRebootState], ended,
		shut.StartTime.UTC().Format(time.TimeOnly), shut.EndTime.UTC().Format(time.TimeOnly))
	if pod.Status.Phase != "Succeeded" || pod.Metadata.Annotations[operatorRebootState] != "completed" {
		t.Fatalf("kairos-operator v0.1.3 would never count this node rebooted (it waits for its reboot Pod to be Succeeded with %s=completed): phase %s (%s: %s), annotation %q\n%s",
			operatorRebootState, pod.Status.Phase, pod.Status.Reason, pod.Status.Message, pod.Metadata.Annotations[operatorRebootState], out)
	}
}

// kubectlLogs is a Pod's log, for a failure message (best effort).
func kubectlLogs(n *harness.Node, pod string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := n.Output(ctx, "/usr/bin/kubectl", "--kubeconfig", "/etc/kubernetes/admin.conf", "--request-timeout=20s", "logs", pod)
	if err != nil {
		return fmt.Sprintf("(logs of %s: %v)", pod, err)
	}
	return strings.TrimSpace(out)
}
