package clusterconfig

import (
	"errors"
	"strings"
	"testing"
)

const good = `
cluster_token: s3cr3t-token-value-that-is-long
control_plane_host: 10.0.0.11
role: init
config: |
  clusterConfiguration:
    kubernetesVersion: v1.37.2
    controlPlaneEndpoint: 10.0.0.11:6443
  initConfiguration:
    nodeRegistration:
      name: cp1
  upgradeConfiguration:
    apply:
      ignorePreflightErrors: [SystemVerification]
providerConfig:
  budgets:
    verify: 5m
`

func TestParseGood(t *testing.T) {
	c, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if c.Role != "init" || c.ControlPlaneHost != "10.0.0.11" {
		t.Fatalf("%+v", c)
	}
	k, err := c.Kubeadm()
	if err != nil {
		t.Fatal(err)
	}
	pin, err := k.Pin()
	if err != nil || pin != "v1.37.2" {
		t.Fatalf("pin %q %v", pin, err)
	}
	if k.UpgradeConfiguration == nil || k.InitConfiguration == nil {
		t.Fatal("documents lost")
	}
}

func TestParseBad(t *testing.T) {
	for name, in := range map[string]string{
		"not yaml":            "cluster_token: [\n",
		"config as a map":     "role: init\nconfig:\n  clusterConfiguration:\n    kubernetesVersion: v1.37.2\n",
		"role as a list":      "role: [init]\n",
		"token as a number":   "cluster_token: 12345\n",
		"empty":               "",
		"a list":              "- a\n- b\n",
		"env with a list":     "env: [a]\n",
		"ca_certs not a list": "ca_certs: 5\n",
		"oversize":            "role: init\nconfig: \"" + strings.Repeat("x", MaxSize) + "\"\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(in))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("want ErrInvalid, got %v", err)
			}
		})
	}
}

func TestErrorsNeverQuoteTheToken(t *testing.T) {
	in := "cluster_token: [abcdef.0123456789abcdef]\nrole: init\n"
	_, err := Parse([]byte(in))
	if err == nil || strings.Contains(err.Error(), "0123456789abcdef") {
		t.Fatalf("error %v", err)
	}
}

func TestPin(t *testing.T) {
	for cfg, want := range map[string]string{
		"clusterConfiguration:\n  kubernetesVersion: v1.36.3\n": "v1.36.3",
		"clusterConfiguration: {}\n":                            "",
		"initConfiguration: {}\n":                               "",
		"":                                                      "",
		"clusterConfiguration:\n  kubernetesVersion: latest\n": "latest",
	} {
		k, err := (&Cluster{Config: cfg}).Kubeadm()
		if err != nil {
			t.Fatalf("%q: %v", cfg, err)
		}
		got, err := k.Pin()
		if err != nil || got != want {
			t.Errorf("%q: pin %q %v, want %q", cfg, got, err, want)
		}
	}
	k, err := (&Cluster{Config: "clusterConfiguration:\n  kubernetesVersion: 1.37\n"}).Kubeadm()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Pin(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a YAML number pin: %v", err)
	}
	if _, err := (&Cluster{Config: "clusterConfiguration:\n  kubernetesVersion: v1.37.2\nbogusKey: 1\n"}).Kubeadm(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unknown key accepted: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte("role: worker\nconfig: \"clusterConfiguration: {kubernetesVersion: v1.36.3}\"\n"))
	f.Add([]byte("config: {a: b}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error not ErrInvalid: %v", err)
			}
			return
		}
		k, err := c.Kubeadm()
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("config error not ErrInvalid: %v", err)
			}
			return
		}
		if _, err := k.Pin(); err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("pin error not ErrInvalid: %v", err)
		}
	})
}
