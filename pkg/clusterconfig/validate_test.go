package clusterconfig

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"
)

const secretToken = "Zq8-r4Nd0m-cluster-T0ken-9f3a"

func section(role, host, config string) string {
	s := "cluster_token: " + secretToken + "\n"
	if host != "" {
		s += "control_plane_host: " + host + "\n"
	}
	if role != "" {
		s += "role: " + role + "\n"
	}
	return s + config
}

const goodConfig = "config: |\n  clusterConfiguration:\n    kubernetesVersion: v1.37.2\n"

func validate(t *testing.T, in string) error {
	t.Helper()
	c, err := Parse([]byte(in))
	if err != nil {
		return err
	}
	_, err = c.Validate()
	return err
}

func TestValidateGood(t *testing.T) {
	for name, in := range map[string]string{
		"init":             section("init", "10.0.0.11", goodConfig),
		"worker with port": section("worker", "cp.example.com:7443", goodConfig),
		"ipv6":             section("controlplane", `"[fd00::1]:6443"`, goodConfig),
		"bare ipv6":        section("controlplane", "fd00::1", goodConfig),
		"explicit material": section("controlplane", "10.0.0.11", `config: |
  clusterConfiguration:
    apiVersion: kubeadm.k8s.io/v1beta4
    kind: ClusterConfiguration
    kubernetesVersion: v1.37.2
    controlPlaneEndpoint: lb.example.com:6443
  initConfiguration:
    bootstrapTokens:
    - token: abcdef.0123456789abcdef
      ttl: 2h
    certificateKey: `+strings.Repeat("ab", 32)+`
  joinConfiguration:
    discovery:
      bootstrapToken:
        token: abcdef.0123456789abcdef
        apiServerEndpoint: lb.example.com:6443
        caCertHashes: [sha256:`+strings.Repeat("0f", 32)+`]
    controlPlane:
      certificateKey: `+strings.Repeat("cd", 32)+`
  kubeletConfiguration:
    failCgroupV1: false
`),
	} {
		t.Run(name, func(t *testing.T) {
			if err := validate(t, in); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Each bad section gives one error that names its key, and never the token.
func TestValidateBad(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"missing role", section("", "10.0.0.11", goodConfig), "role is missing"},
		{"unknown role", section("master", "10.0.0.11", goodConfig), "role is not init, controlplane or worker"},
		{"missing token", "role: init\ncontrol_plane_host: 10.0.0.11\n" + goodConfig, "cluster_token is missing"},
		{"short token", strings.Replace(section("init", "10.0.0.11", goodConfig), secretToken, "abc123", 1), "cluster_token is too short (6 characters"},
		{"token with a space inside", strings.Replace(section("init", "10.0.0.11", goodConfig), secretToken, secretToken[:10]+" "+secretToken[10:], 1), "cluster_token has leading, trailing or embedded whitespace"},
		{"token with a control character", strings.Replace(section("init", "10.0.0.11", goodConfig), secretToken, `"`+secretToken[:10]+`\u0001`+secretToken[10:]+`"`, 1), "or a control character"},
		{"repetitive token", strings.Replace(section("init", "10.0.0.11", goodConfig), secretToken, strings.Repeat("ab", 20), 1), "cluster_token is too repetitive"},
		// Long and varied enough to pass the other checks: refused by name as the example's placeholder.
		{"placeholder token", strings.Replace(section("init", "10.0.0.11", goodConfig), secretToken, "<your-random-cluster-token-here>", 1), "cluster_token is still a placeholder"},
		{"config as a map", section("init", "10.0.0.11", "config:\n  clusterConfiguration:\n    kubernetesVersion: v1.37.2\n"), "config must be a YAML string holding the kubeadm documents by key (write config: | and indent them), got a map"},
		{"missing host", section("worker", "", goodConfig), "control_plane_host is missing"},
		{"endpoint without a host", section("worker", ":6443", goodConfig), "control_plane_host: no host"},
		{"endpoint with a scheme", section("worker", "https://cp:6443", goodConfig), "control_plane_host: not a host or host:port (no scheme, no path)"},
		{"endpoint bad port", section("worker", "cp:99999", goodConfig), "control_plane_host: the port is not 1-65535"},
		{"cluster endpoint without a host", section("init", "10.0.0.11", "config: |\n  clusterConfiguration:\n    kubernetesVersion: v1.37.2\n    controlPlaneEndpoint: \":6443\"\n"), "clusterConfiguration.controlPlaneEndpoint: no host"},
		{"invalid yaml", section("init", "10.0.0.11", "config: |\n  clusterConfiguration:\n    kubernetesVersion: v1.37.2\n   bad: [\n"), "config: "},
		{"unknown document", section("init", "10.0.0.11", "config: |\n  clusterConfiguration:\n    kubernetesVersion: v1.37.2\n  initConfig:\n    a: 1\n"), "unknown key, a key of 10 characters (not shown; did you mean initConfiguration?)"},
		{"missing pin", section("init", "10.0.0.11", "config: |\n  initConfiguration: {}\n"), "clusterConfiguration.kubernetesVersion is missing"},
		{"bad pin", section("init", "10.0.0.11", "config: |\n  clusterConfiguration:\n    kubernetesVersion: stable\n"), "kubernetesVersion is not an exact vMAJOR.MINOR.PATCH release"},
		{"wrong apiVersion", section("init", "10.0.0.11", "config: |\n  clusterConfiguration:\n    apiVersion: kubeadm.k8s.io/v1beta3\n    kubernetesVersion: v1.37.2\n"), "clusterConfiguration.apiVersion must be kubeadm.k8s.io/v1beta4"},
		{"wrong kind", section("init", "10.0.0.11", "config: |\n  clusterConfiguration:\n    kubernetesVersion: v1.37.2\n  initConfiguration:\n    kind: JoinConfiguration\n"), "initConfiguration.kind must be InitConfiguration"},
		{"unsafe skip", section("worker", "10.0.0.11", goodConfig+"  joinConfiguration:\n    discovery:\n      bootstrapToken:\n        unsafeSkipCAVerification: true\n"), "unsafeSkipCAVerification must not be set"},
		{"file discovery", section("worker", "10.0.0.11", goodConfig+"  joinConfiguration:\n    discovery:\n      file:\n        kubeConfigPath: /x\n"), "discovery.file is not supported"},
		{"unsafe skip, capitalised", section("worker", "10.0.0.11", goodConfig+"  joinConfiguration:\n    discovery:\n      bootstrapToken:\n        UnsafeSkipCAVerification: true\n"), "unsafeSkipCAVerification must not be set"},
		{"unsafe skip, lower case", section("worker", "10.0.0.11", goodConfig+"  joinConfiguration:\n    discovery:\n      bootstrapToken:\n        unsafeskipcaverification: \"true\"\n"), "unsafeSkipCAVerification must not be set"},
		{"file discovery, capitalised", section("worker", "10.0.0.11", goodConfig+"  joinConfiguration:\n    discovery:\n      File:\n        kubeConfigPath: /x\n"), "discovery.file is not supported"},
		{"bad hash", section("worker", "10.0.0.11", goodConfig+"  joinConfiguration:\n    discovery:\n      bootstrapToken:\n        caCertHashes: [sha256:zz]\n"), "caCertHashes[0] is not sha256:"},
		{"bad join token", section("worker", "10.0.0.11", goodConfig+"  joinConfiguration:\n    discovery:\n      bootstrapToken:\n        token: "+secretToken+"\n"), "bootstrapToken.token is not a bootstrap token"},
		{"unbounded ttl", section("init", "10.0.0.11", goodConfig+"  initConfiguration:\n    bootstrapTokens:\n    - token: abcdef.0123456789abcdef\n      ttl: 0s\n"), "bootstrapTokens[0].ttl is not bounded: want more than 0 and at most 168h0m0s"},
		{"long ttl", section("init", "10.0.0.11", goodConfig+"  initConfiguration:\n    bootstrapTokens:\n    - token: abcdef.0123456789abcdef\n      ttl: 720h\n"), "bootstrapTokens[0].ttl is not bounded"},
		{"token without token", section("init", "10.0.0.11", goodConfig+"  initConfiguration:\n    bootstrapTokens:\n    - ttl: 1h\n"), "bootstrapTokens[0].token is missing"},
		{"bad certificate key", section("init", "10.0.0.11", goodConfig+"  initConfiguration:\n    certificateKey: "+secretToken+"\n"), "initConfiguration.certificateKey is not 64 lowercase hex digits"},
		{"bad ca_certs", section("worker", "10.0.0.11", goodConfig+"ca_certs:\n- not a certificate\n"), "ca_certs[0]: no PEM CERTIFICATE block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validate(t, tc.in)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("want ErrInvalid, got %v", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
			// Every token a row puts in, weak or not, is a secret: never quoted.
			for _, secret := range []string{secretToken, "0123456789abcdef", "abc123", strings.Repeat("ab", 20), "your-random-cluster-token-here"} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("error quotes a secret: %q", err)
				}
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error is not one line: %q", err)
			}
		})
	}
}

func TestEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.11":          "10.0.0.11:6443",
		"10.0.0.11:7443":     "10.0.0.11:7443",
		"cp.example.com":     "cp.example.com:6443",
		"fd00::1":            "[fd00::1]:6443",
		"[fd00::1]":          "[fd00::1]:6443",
		"[fd00::1]:443":      "[fd00::1]:443",
		"cp.example.com:443": "cp.example.com:443",
	} {
		got, err := Endpoint(in)
		if err != nil || got != want {
			t.Errorf("Endpoint(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", ":6443", "cp:", "cp:0", "https://cp", "cp/x", "a:b:c"} {
		if got, err := Endpoint(in); err == nil {
			t.Errorf("Endpoint(%q) = %q, want an error", in, got)
		}
	}
}

// The CA pin is what kubeadm computes: sha256 over the DER SubjectPublicKeyInfo.
func TestCertHashes(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	spki, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(spki)
	want := "sha256:" + hex.EncodeToString(sum[:])
	p := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	got, err := CertHashes("junk before\n" + p + p)
	if err != nil || len(got) != 2 || got[0] != want || !ValidCAHash(got[0]) {
		t.Fatalf("%v %v, want 2x %s", got, err, want)
	}
}

// Issue 13, class 4: a secret pasted where something else belongs (a YAML
// key, role, a TTL, the pin, the endpoint, a list item, a map key of the
// config, a value of the wrong kind) is refused with an error that names
// the key and the expected form, never the value.
func TestErrorsNeverQuoteAValueFromTheSection(t *testing.T) {
	const s = "Zq8r4Nd0mclusterT0ken9f3a"
	for _, tc := range []struct{ name, in string }{
		{"token as role", section(s, "10.0.0.11", goodConfig)},
		{"token as endpoint port", section("worker", "cp:"+s, goodConfig)},
		{"token in endpoint with scheme", section("worker", "https://"+s, goodConfig)},
		{"token as pin", section("init", "10.0.0.11", "config: |\n  clusterConfiguration:\n    kubernetesVersion: "+s+"\n")},
		{"token as ttl", section("init", "10.0.0.11", goodConfig+"  initConfiguration:\n    bootstrapTokens:\n    - token: abcdef.0123456789abcdef\n      ttl: "+s+"\n")},
		{"token as a document key", section("init", "10.0.0.11", goodConfig+"  "+s+":\n    a: 1\n")},
		{"token as a number-typed value", "cluster_token: 1" + strings.Repeat("7", 30) + "\nrole: init\n"},
		{"token as a list", "cluster_token: [" + s + "]\nrole: init\n"},
		{"token in a map key of providerConfig values", section("init", "10.0.0.11", goodConfig) + "providerConfig:\n  budget.verify: {" + s + ": 1}\n"},
		{"token in ca_certs", section("worker", "10.0.0.11", goodConfig) + "ca_certs:\n- {" + s + ": 1}\n"},
		{"token in a broken YAML line", section("init", "10.0.0.11", goodConfig) + s + ": [\n"},
		{"token as a map key", section("init", "10.0.0.11", goodConfig) + "? {" + s + ": 1}\n: x\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validate(t, tc.in)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, part := range []string{s, "777777777777"} {
				if strings.Contains(err.Error(), part) {
					t.Fatalf("error quotes a value: %q", err)
				}
			}
		})
	}
}

// Problems lists every problem, not only the first; Validate returns the
// first of them.
func TestProblemsListsEveryProblem(t *testing.T) {
	in := "cluster_token: short\nrole: leader\nconfig: |\n  clusterConfiguration:\n    kubernetesVersion: v1.37\n" +
		"  initConfiguration:\n    certificateKey: nothex\n" +
		"  joinConfiguration:\n    discovery:\n      bootstrapToken:\n        unsafeSkipCAVerification: true\n        caCertHashes: [sha256:0, sha256:1]\n"
	c, err := Parse([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	_, problems := c.Problems()
	want := []string{"role is not init", "cluster_token is too short", "control_plane_host is missing",
		"kubernetesVersion is not an exact", "initConfiguration.certificateKey", "unsafeSkipCAVerification",
		"caCertHashes[0]", "caCertHashes[1]"}
	if len(problems) != len(want) {
		t.Fatalf("%d problems, want %d: %v", len(problems), len(want), problems)
	}
	for i, w := range want {
		if !errors.Is(problems[i], ErrInvalid) || !strings.Contains(problems[i].Error(), w) {
			t.Errorf("problem %d: %v, want %q", i, problems[i], w)
		}
	}
	if _, err := c.Validate(); err == nil || err.Error() != problems[0].Error() {
		t.Fatalf("Validate: %v, want the first problem %v", err, problems[0])
	}
}

// Every bad key of the section is listed; the first is Parse's error.
func TestParseCloudConfigProblemsListsEveryKey(t *testing.T) {
	in := "#cloud-config\ncluster:\n  role: [init]\n  env: {A: b}\n  config:\n    clusterConfiguration: {}\n  ca_certs: [1, x, 2]\n"
	c, problems := ParseCloudConfigProblems([]byte(in))
	want := []string{"role must be a string", "env is a key", "config must be a YAML string", "ca_certs[0]", "ca_certs[2]"}
	if c != nil || len(problems) != len(want) {
		t.Fatalf("%v, %d problems, want %d: %v", c, len(problems), len(want), problems)
	}
	for i, w := range want {
		if !strings.Contains(problems[i].Error(), w) {
			t.Errorf("problem %d: %v, want %q", i, problems[i], w)
		}
	}
	if _, _, err := ParseCloudConfig([]byte(in)); err == nil || err.Error() != problems[0].Error() {
		t.Fatalf("ParseCloudConfig: %v, want %v", err, problems[0])
	}
}
