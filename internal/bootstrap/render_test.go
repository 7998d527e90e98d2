package bootstrap

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/internal/testbin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
)

const clusterToken = "Zq8-r4Nd0m-cluster-T0ken-9f3a"

// cluster parses a cluster section: role, host, extra top-level keys and
// the config string's documents (indented by two spaces by the caller).
func cluster(t testing.TB, role, host, extraKeys, docs string) *clusterconfig.Cluster {
	t.Helper()
	in := "cluster_token: " + clusterToken + "\ncontrol_plane_host: \"" + host + "\"\nrole: " + role + "\n" + extraKeys +
		"config: |\n  clusterConfiguration:\n    kubernetesVersion: v1.37.2\n" + docs
	c, err := clusterconfig.Parse([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// splitDocs parses a rendered multi-document YAML by kind.
func splitDocs(t *testing.T, b []byte) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, d := range strings.Split(string(b), "\n---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(d), &m); err != nil {
			t.Fatalf("%v\n%s", err, d)
		}
		out[m["kind"].(string)] = m
	}
	return out
}

func get(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

func TestDeriveIsDeterministicValidAndPinned(t *testing.T) {
	tok := DeriveToken(clusterToken)
	if !clusterconfig.ValidBootstrapToken(tok) || tok != DeriveToken(clusterToken) {
		t.Fatalf("token %q", tok)
	}
	key := DeriveCertificateKey(clusterToken)
	if !clusterconfig.ValidCertificateKey(key) || key != DeriveCertificateKey(clusterToken) {
		t.Fatalf("key %q", key)
	}
	if DeriveToken(clusterToken+"x") == tok || DeriveCertificateKey(clusterToken+"x") == key {
		t.Fatal("a different cluster token derives the same secrets")
	}
	// Golden values (computed independently with Python's hmac): a change
	// here breaks joins into clusters initialised before it.
	if tok != "azpms3.idqe3n3dhvgegea3" || key != "3e4cb1e1fc7a53f4a6c1effc4bdc42531ffb9328e2f7b26530ecdbab7e2ad53f" {
		t.Fatalf("derivation changed: token %q key %q", tok, key)
	}
	// Every output character is reachable and the mapping stays in the alphabet.
	seen := map[rune]bool{}
	for i := 0; i < 400; i++ {
		for _, r := range strings.ReplaceAll(DeriveToken(clusterToken+string(rune('a'+i%26))+strings.Repeat("z", i)), ".", "") {
			seen[r] = true
		}
	}
	if len(seen) != 36 {
		t.Fatalf("alphabet coverage %d of 36", len(seen))
	}
}

func TestRenderInitDefaults(t *testing.T) {
	c := cluster(t, "init", "10.0.0.11", "", "  initConfiguration:\n    nodeRegistration:\n      name: cp1\n  kubeletConfiguration:\n    failCgroupV1: false\n")
	r, err := RenderInit(c)
	if err != nil {
		t.Fatal(err)
	}
	d := splitDocs(t, r.Config)
	if len(d) != 3 || d["KubeletConfiguration"]["apiVersion"] != "kubelet.config.k8s.io/v1beta1" {
		t.Fatalf("documents %v", d)
	}
	// Graceful node shutdown, which the kubelet leaves off, is on in the
	// configuration init uploads for every node: 30s, 10s of it for
	// critical pods (cloud-config.md).
	if kc := d["KubeletConfiguration"]; kc["shutdownGracePeriod"] != "30s" || kc["shutdownGracePeriodCriticalPods"] != "10s" || kc["failCgroupV1"] != false {
		t.Fatalf("kubelet configuration %v", kc)
	}
	in := d["InitConfiguration"]
	if in["apiVersion"] != "kubeadm.k8s.io/v1beta4" || get(in, "nodeRegistration", "name") != "cp1" {
		t.Fatalf("init %v", in)
	}
	toks := in["bootstrapTokens"].([]any)
	if len(toks) != 1 || get(toks[0].(map[string]any), "token") != DeriveToken(clusterToken) || get(toks[0].(map[string]any), "ttl") != "24h0m0s" {
		t.Fatalf("tokens %v", toks)
	}
	if in["certificateKey"] != DeriveCertificateKey(clusterToken) || r.TokenSource != SourceDerived || r.KeySource != SourceDerived {
		t.Fatalf("key %v %s %s", in["certificateKey"], r.TokenSource, r.KeySource)
	}
	cc := d["ClusterConfiguration"]
	if cc["controlPlaneEndpoint"] != "10.0.0.11:6443" || cc["kubernetesVersion"] != "v1.37.2" || r.Endpoint != "10.0.0.11:6443" {
		t.Fatalf("cluster %v", cc)
	}
	// The cluster section is not modified: rendering twice gives the same bytes.
	r2, err := RenderInit(c)
	if err != nil || string(r2.Config) != string(r.Config) {
		t.Fatalf("render is not repeatable: %v", err)
	}
}

func TestRenderInitKeepsExplicitValues(t *testing.T) {
	key := strings.Repeat("ab", 32)
	c := cluster(t, "init", "10.0.0.11", "", "    controlPlaneEndpoint: lb.example.com:7443\n  initConfiguration:\n    certificateKey: "+key+
		"\n    bootstrapTokens:\n    - token: abcdef.0123456789abcdef\n      ttl: 2h\n")
	r, err := RenderInit(c)
	if err != nil {
		t.Fatal(err)
	}
	d := splitDocs(t, r.Config)
	if d["InitConfiguration"]["certificateKey"] != key || r.KeySource != SourceExplicit || r.TokenSource != SourceExplicit {
		t.Fatal("explicit key replaced")
	}
	if strings.Contains(string(r.Config), DeriveToken(clusterToken)) {
		t.Fatal("derived token added next to an explicit one")
	}
	if r.Endpoint != "lb.example.com:7443" || d["ClusterConfiguration"]["controlPlaneEndpoint"] != "lb.example.com:7443" {
		t.Fatalf("endpoint %s", r.Endpoint)
	}
	if _, err := RenderJoin(c); !errors.Is(err, ErrRoleConflict) {
		t.Fatalf("join with role init: %v", err)
	}
}

func TestRenderJoin(t *testing.T) {
	ca := testCA(t)
	given := "sha256:" + strings.Repeat("0f", 32)
	t.Run("worker", func(t *testing.T) {
		c := cluster(t, "worker", "10.0.0.11:7443", "ca_certs:\n- |\n"+indent(ca.pem, "  "),
			"  joinConfiguration:\n    nodeRegistration:\n      name: w1\n    discovery:\n      bootstrapToken:\n        caCertHashes: ["+given+"]\n")
		r, err := RenderJoin(c)
		if err != nil {
			t.Fatal(err)
		}
		d := splitDocs(t, r.Config)
		if len(d) != 1 {
			t.Fatalf("join renders only a JoinConfiguration: %v", d)
		}
		j := d["JoinConfiguration"]
		bt := get(j, "discovery", "bootstrapToken").(map[string]any)
		if bt["token"] != DeriveToken(clusterToken) || bt["apiServerEndpoint"] != "10.0.0.11:7443" || get(j, "nodeRegistration", "name") != "w1" {
			t.Fatalf("join %v", j)
		}
		hashes := bt["caCertHashes"].([]any)
		if len(hashes) != 2 || !contains(hashes, given) || !contains(hashes, ca.hash) || len(r.CAHashes) != 2 {
			t.Fatalf("hashes %v", hashes)
		}
		if _, ok := bt["unsafeSkipCAVerification"]; ok || j["controlPlane"] != nil || r.ControlPlane {
			t.Fatalf("join %v", j)
		}
	})
	t.Run("control plane takes the init document's explicit material", func(t *testing.T) {
		key := strings.Repeat("cd", 32)
		c := cluster(t, "controlplane", "10.0.0.11", "",
			"  initConfiguration:\n    certificateKey: "+key+"\n    bootstrapTokens:\n    - token: abcdef.0123456789abcdef\n"+
				"  joinConfiguration:\n    discovery:\n      bootstrapToken:\n        caCertHashes: ["+given+"]\n")
		r, err := RenderJoin(c)
		if err != nil {
			t.Fatal(err)
		}
		j := splitDocs(t, r.Config)["JoinConfiguration"]
		if get(j, "controlPlane", "certificateKey") != key || get(j, "discovery", "bootstrapToken", "token") != "abcdef.0123456789abcdef" ||
			!r.ControlPlane || r.KeySource != SourceExplicit || r.TokenSource != SourceExplicit {
			t.Fatalf("join %v", j)
		}
	})
	t.Run("control plane derives", func(t *testing.T) {
		c := cluster(t, "controlplane", "10.0.0.11", "", "  joinConfiguration:\n    discovery:\n      bootstrapToken:\n        caCertHashes: ["+given+"]\n")
		r, err := RenderJoin(c)
		if err != nil {
			t.Fatal(err)
		}
		j := splitDocs(t, r.Config)["JoinConfiguration"]
		if get(j, "controlPlane", "certificateKey") != DeriveCertificateKey(clusterToken) || r.KeySource != SourceDerived {
			t.Fatalf("join %v", j)
		}
	})
	t.Run("no pin", func(t *testing.T) {
		if _, err := RenderJoin(cluster(t, "worker", "10.0.0.11", "", "")); !errors.Is(err, ErrNoCAPin) {
			t.Fatalf("%v", err)
		}
	})
	t.Run("worker with a controlPlane section", func(t *testing.T) {
		c := cluster(t, "worker", "10.0.0.11", "", "  joinConfiguration:\n    controlPlane: {}\n    discovery:\n      bootstrapToken:\n        caCertHashes: ["+given+"]\n")
		if _, err := RenderJoin(c); !errors.Is(err, ErrRoleConflict) {
			t.Fatalf("%v", err)
		}
	})
	t.Run("unsafe skip", func(t *testing.T) {
		c := cluster(t, "worker", "10.0.0.11", "", "  joinConfiguration:\n    discovery:\n      bootstrapToken:\n        unsafeSkipCAVerification: true\n        caCertHashes: ["+given+"]\n")
		if _, err := RenderJoin(c); !errors.Is(err, clusterconfig.ErrInvalid) {
			t.Fatalf("%v", err)
		}
	})
}

// renderedCases are the configurations the provider writes, for the real kubeadm.
func renderedCases(t *testing.T) map[string][]byte {
	ca := testCA(t)
	given := "sha256:" + strings.Repeat("0f", 32)
	out := map[string][]byte{}
	add := func(name string, r Rendered, err error) {
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = r.Config
	}
	r, err := RenderInit(cluster(t, "init", "10.0.0.11", "", ""))
	add("init defaults", r, err)
	r, err = RenderInit(cluster(t, "init", "cp.example.com", "", "    networking:\n      podSubnet: 10.244.0.0/16\n"+
		"  initConfiguration:\n    bootstrapTokens:\n    - token: abcdef.0123456789abcdef\n      ttl: 2h\n    nodeRegistration:\n      name: cp1\n      ignorePreflightErrors: [SystemVerification]\n"+
		"  kubeletConfiguration:\n    failCgroupV1: false\n    cgroupDriver: cgroupfs\n  kubeProxyConfiguration:\n    mode: iptables\n    conntrack:\n      maxPerCore: 0\n"))
	add("init full", r, err)
	r, err = RenderJoin(cluster(t, "worker", "10.0.0.11", "ca_certs:\n- |\n"+indent(ca.pem, "  "), ""))
	add("worker join from ca_certs", r, err)
	r, err = RenderJoin(cluster(t, "controlplane", "[fd00::1]:6443", "", "  joinConfiguration:\n    controlPlane:\n      localAPIEndpoint:\n        advertiseAddress: 10.0.0.12\n    discovery:\n      bootstrapToken:\n        caCertHashes: ["+given+"]\n"))
	add("control plane join", r, err)
	return out
}

// Every configuration the provider writes is accepted by the real kubeadm
// 1.37.2 (strict decoding, defaulting and validation).
func TestRealKubeadmValidatesEveryRenderedConfig(t *testing.T) {
	kubeadm := testbin.Kubeadm(t, "v1.37.2")
	for name, cfg := range renderedCases(t) {
		t.Run(name, func(t *testing.T) {
			kubeadmValidate(t, kubeadm, cfg)
		})
	}
}

func kubeadmValidate(t *testing.T, kubeadm string, cfg []byte) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(f, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubeadm, "config", "validate", "--config", f)
	cmd.Env = runner.BaseEnv
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("kubeadm config validate: %v\n%s\n---\n%s", err, out, redactForTest(cfg))
	}
}

// And kubeadm really rejects what the provider refuses to write, so the
// validation above is not a rubber stamp.
func TestRealKubeadmRejectsAnUnpinnedJoin(t *testing.T) {
	kubeadm := testbin.Kubeadm(t, "v1.37.2")
	f := filepath.Join(t.TempDir(), "config.yaml")
	cfg := "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\ndiscovery:\n  bootstrapToken:\n    token: abcdef.0123456789abcdef\n    apiServerEndpoint: 10.0.0.11:6443\n"
	if err := os.WriteFile(f, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := testutil.Command(t, time.Minute, kubeadm, "config", "validate", "--config", f).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "caCertHashes") {
		t.Fatalf("kubeadm accepted an unpinned join: %s", out)
	}
}

var secretRE = regexp.MustCompile(`[a-z0-9]{6}\.[a-z0-9]{16}|[0-9a-f]{64}`)

func redactForTest(b []byte) string { return secretRE.ReplaceAllString(string(b), "[redacted]") }

func contains(list []any, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func indent(s, pre string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i := range lines {
		lines[i] = pre + lines[i]
	}
	return strings.Join(lines, "\n") + "\n"
}
