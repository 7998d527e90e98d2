package clusterview

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

var (
	window = version.Window{{Major: 1, Minor: 35}, {Major: 1, Minor: 36}, {Major: 1, Minor: 37}}
	now    = time.Date(2026, 11, 29, 12, 10, 0, 0, time.UTC)
)

func ann(phase, outcome, pin, refusal string) map[string]string {
	return map[string]string{status.AnnotationPrefix + "phase": phase, status.AnnotationPrefix + "outcome": outcome, status.AnnotationPrefix + "pin": pin,
		status.AnnotationPrefix + "refusal": refusal, status.AnnotationPrefix + "time": "2026-11-29T12:00:00Z"}
}

func cp(name, kubelet, apiserver string, a map[string]string) Node {
	return Node{Name: name, ControlPlane: true, Kubelet: kubelet, Ready: true, APIServer: apiserver, Annotations: a}
}

func worker(name, kubelet string, a map[string]string) Node {
	return Node{Name: name, Kubelet: kubelet, Ready: true, Annotations: a}
}

func TestNextStep(t *testing.T) {
	conv := func(pin string) map[string]string { return ann("Converged", "converged", pin, "") }
	for _, tc := range []struct {
		name      string
		cluster   string
		nodes     []Node
		converged bool
		target    string
		next      string
		nextBoot  map[string]string
	}{
		{"every node converged", "v1.37.2",
			[]Node{cp("cp1", "v1.37.2", "v1.37.2", conv("v1.37.2")), worker("w1", "v1.37.2", conv("v1.37.2"))},
			true, "v1.37.2", "nothing: every node is converged at v1.37.2", nil},
		{"the first control plane's pin bumped, not booted yet", "v1.36.3",
			[]Node{cp("cp1", "v1.36.3", "v1.36.3", ann("Refused", "refused", "v1.37.2", "PinNewerThanImage")), cp("cp2", "v1.36.3", "v1.36.3", conv("v1.36.3")),
				cp("cp3", "v1.36.3", "v1.36.3", conv("v1.36.3")), worker("w1", "v1.36.3", conv("v1.36.3"))},
			false, "v1.37.2",
			"look at cp1 refused (PinNewerThanImage) first (provider-kubernetes status on the node; docs/troubleshooting); next: boot cp1 into the 1.37 image with pin v1.37.2 (it runs kubeadm upgrade apply); then cp2, then cp3; workers after (w1)",
			map[string]string{"cp1": "etcd-snapshot,upgrade-apply,restart-kubelet,verify", "w1": "wait-for-cluster-upgrade,upgrade-node,restart-kubelet,verify"}},
		{"after the first control plane's apply", "v1.37.2",
			[]Node{cp("cp1", "v1.37.2", "v1.37.2", conv("v1.37.2")), cp("cp2", "v1.36.3", "v1.36.3", conv("v1.36.3")),
				cp("cp3", "v1.36.3", "v1.36.3", conv("v1.36.3")), worker("w1", "v1.36.3", conv("v1.36.3")), worker("w2", "v1.36.3", conv("v1.36.3"))},
			false, "v1.37.2", "next: boot cp2 into the 1.37 image with pin v1.37.2; then cp3; workers after (w1, w2)",
			map[string]string{"cp2": "upgrade-node,restart-kubelet,verify"}},
		{"control planes done, a worker left", "v1.37.2",
			[]Node{cp("cp1", "v1.37.2", "v1.37.2", conv("v1.37.2")), worker("w1", "v1.37.2", conv("v1.37.2")), worker("w2", "v1.36.3", ann("Failed", "failed", "v1.37.2", ""))},
			false, "v1.37.2", "look at w2 failed () first (provider-kubernetes status on the node; docs/troubleshooting); next: boot w2 into the 1.37 image with pin v1.37.2", nil},
		{"a control plane two minors behind", "v1.37.2",
			[]Node{cp("cp1", "v1.37.2", "v1.37.2", conv("v1.37.2")), cp("cp2", "v1.35.4", "v1.35.4", conv("v1.35.4"))},
			false, "v1.37.2", "reset and rejoin cp2 at v1.37.2: too far behind the cluster to upgrade one minor at a time (docs/reset-and-rejoin)",
			map[string]string{"cp2": "refuse SkipLevel"}},
		{"a worker two minors behind, a control plane one", "v1.37.2",
			[]Node{cp("cp1", "v1.37.2", "v1.37.2", conv("v1.37.2")), cp("cp2", "v1.36.3", "v1.36.3", conv("v1.36.3")), worker("w1", "v1.35.4", conv("v1.35.4"))},
			false, "v1.37.2", "reset and rejoin w1 at v1.37.2: too far behind the cluster to upgrade one minor at a time (docs/reset-and-rejoin); next: boot cp2 into the 1.37 image with pin v1.37.2",
			map[string]string{"cp2": "upgrade-node,restart-kubelet,verify", "w1": "refuse SkipLevel"}},
		{"a node that never published", "v1.37.2",
			[]Node{cp("cp1", "v1.37.2", "v1.37.2", nil)},
			true, "v1.37.2", "nothing: every node is converged at v1.37.2", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, _ := version.ParseReported(tc.cluster)
			v := Build(window, cl, tc.nodes, now)
			if v.Converged != tc.converged || v.Target != tc.target || v.NextStep != tc.next {
				t.Fatalf("converged %v target %s next\n%q\nwant %v %s\n%q", v.Converged, v.Target, v.NextStep, tc.converged, tc.target, tc.next)
			}
			for _, r := range v.Nodes {
				if want, ok := tc.nextBoot[r.Name]; ok && r.Next != want {
					t.Errorf("%s next boot %q, want %q", r.Name, r.Next, want)
				}
			}
		})
	}
}

func TestPrint(t *testing.T) {
	a := ann("Refused", "refused", "v1.37.2\x1b[2J\nfake", "PinNewerThanImage")
	v := Build(window, version.MustParse("v1.36.3"), []Node{cp("cp1", "v1.36.3", "v1.36.3", a), worker("w1", "v1.36.3", nil)}, now)
	var b bytes.Buffer
	if err := Print(&b, v, "text"); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.ContainsRune(out, 0x1b) || strings.Count(out, "\n") != 4 {
		t.Fatalf("not escaped:\n%s", out)
	}
	for _, want := range []string{"NODE", "cp1", "control-plane", "PinNewerThanImage", "10m0s ago", "w1", "worker"} {
		if !strings.Contains(out, want) {
			t.Fatalf("lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	if err := Print(&b, v, "json"); err != nil {
		t.Fatal(err)
	}
	var back View
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || len(back.Nodes) != 2 || back.NextStep != v.NextStep {
		t.Fatalf("json: %v %+v", err, back)
	}
}

// The rollout's target is the newest of the cluster's version, any node's
// pin and any apiserver: each alone ahead of the rest sets it.
func TestTargetIsTheNewestOfClusterPinsAndAPIServers(t *testing.T) {
	conv := func(pin string) map[string]string { return ann("Converged", "converged", pin, "") }
	for _, tc := range []struct {
		name    string
		cluster string
		nodes   []Node
	}{
		{"kubeadm-config ahead", "v1.37.2", []Node{cp("cp1", "v1.36.3", "v1.36.3", conv("v1.36.3")), worker("w1", "v1.36.3", conv("v1.36.3"))}},
		{"a pin ahead", "v1.36.3", []Node{cp("cp1", "v1.36.3", "v1.36.3", conv("v1.36.3")), worker("w1", "v1.36.3", conv("v1.37.2"))}},
		{"an apiserver ahead", "v1.36.3", []Node{cp("cp1", "v1.36.3", "v1.37.2", conv("v1.36.3")), worker("w1", "v1.36.3", conv("v1.36.3"))}},
	} {
		v := Build(window, version.MustParse(tc.cluster), tc.nodes, now)
		if v.Target != "v1.37.2" || v.Converged {
			t.Errorf("%s: target %s converged %v, want v1.37.2 and not converged", tc.name, v.Target, v.Converged)
		}
	}
}

// Converged (status --cluster's exit 0) is every node at the target, its
// kubelet included, Ready, its last pass neither refused nor failed.
func TestConvergedIsEveryNodeAtTheTargetReadyAndNotFailed(t *testing.T) {
	conv := ann("Converged", "converged", "v1.37.2", "")
	good := func() []Node {
		return []Node{cp("cp1", "v1.37.2", "v1.37.2", conv), worker("w1", "v1.37.2", conv)}
	}
	if v := Build(window, version.MustParse("v1.37.2"), good(), now); !v.Converged {
		t.Fatalf("every node at v1.37.2: not converged: %+v", v)
	}
	for name, change := range map[string]func(n []Node){
		"a worker NotReady":                          func(n []Node) { n[1].Ready = false },
		"a control plane's kubelet behind":           func(n []Node) { n[0].Kubelet = "v1.36.3" },
		"a control plane's apiserver behind":         func(n []Node) { n[0].APIServer = "v1.36.3" },
		"a worker's last pass refused at the target": func(n []Node) { n[1].Annotations = ann("Refused", "refused", "v1.37.2", "PinNewerThanImage") },
		"a worker's last pass failed at the target":  func(n []Node) { n[1].Annotations = ann("Failed", "failed", "v1.37.2", "") },
	} {
		nodes := good()
		change(nodes)
		if v := Build(window, version.MustParse("v1.37.2"), nodes, now); v.Converged {
			t.Errorf("%s: converged", name)
		}
	}
}
