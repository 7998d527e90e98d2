package clusterconfig

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	sdk "github.com/kairos-io/kairos-sdk/clusterplugin"
	yaml3 "gopkg.in/yaml.v3"
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
  budget.verify: 5m
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
	f.Add([]byte("#cloud-config\ncluster:\n  role: init\n  providerConfig: {budget.verify: 1m}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		// The whole cloud-config the plugin is handed, too.
		if _, _, err := ParseCloudConfig(b); err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("cloud-config error not ErrInvalid: %v", err)
		}
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

// The section is Kairos's schema: what kairos-sdk's clusterplugin.Config
// decodes (yaml.v3, as the SDK's own cluster plugin does) is what Parse and
// ParseCloudConfig return, field by field.
func TestKairosSchema(t *testing.T) {
	cloud := "#cloud-config\nhostname: cp1\ncluster:\n" + indent(good+"ca_certs:\n- abc\n", "  ")
	var want sdk.Config
	if err := yaml3.Unmarshal([]byte(cloud), &want); err != nil || want.Cluster == nil {
		t.Fatalf("the SDK's own parser: %v", err)
	}
	got, section, err := ParseCloudConfig([]byte(cloud))
	if err != nil {
		t.Fatal(err)
	}
	w := want.Cluster
	if got.ClusterToken != w.ClusterToken || got.ControlPlaneHost != w.ControlPlaneHost || got.Role != string(w.Role) ||
		got.Config != w.Options || fmt.Sprint(got.ProviderConfig) != fmt.Sprint(w.ProviderOptions) ||
		fmt.Sprint(got.CACerts) != fmt.Sprint(w.CACerts) {
		t.Fatalf("got %+v\nthe SDK read %+v", got, w)
	}
	if got.ProviderConfig["budget.verify"] != "5m" {
		t.Fatalf("providerConfig %v", got.ProviderConfig)
	}
	// The section written for the boot stage parses back to the same thing.
	again, err := Parse(section)
	if err != nil || fmt.Sprint(*again) != fmt.Sprint(*got) {
		t.Fatalf("the section does not round-trip: %v\n%+v\n%+v", err, again, got)
	}
	var sdkAgain sdk.Cluster
	if err := yaml3.Unmarshal(section, &sdkAgain); err != nil || sdkAgain.Options != w.Options {
		t.Fatalf("the SDK cannot read the written section: %v", err)
	}

	for name, cc := range map[string]string{"no section": "#cloud-config\nhostname: x\n", "null section": "cluster:\n", "empty": ""} {
		c, s, err := ParseCloudConfig([]byte(cc))
		if c != nil || s != nil || err != nil {
			t.Errorf("%s: %v %q %v", name, c, s, err)
		}
	}
}

// The nested providerConfig of earlier releases is not Kairos's schema (the
// SDK fails on it with "cannot unmarshal !!map into string"): refused, with
// the key named and the flat form explained.
func TestNestedProviderConfigIsRefused(t *testing.T) {
	in := "role: init\nproviderConfig:\n  budgets:\n    verify: 5m\n"
	var s sdk.Cluster
	if err := yaml3.Unmarshal([]byte(in), &s); err == nil {
		t.Fatal("the SDK accepts a nested providerConfig: this test's premise is wrong")
	}
	_, err := Parse([]byte(in))
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "providerConfig is a flat map of strings (Kairos's schema); the value of budgets is not a string: "+
		"write each budget as its own key, budget.<name>: <duration> (e.g. budget.verify: 6m)") {
		t.Fatalf("%v", err)
	}
}

func indent(s, prefix string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString(prefix + l + "\n")
	}
	return b.String()
}

// Keys of Kairos's schema the provider does not act on are refused by
// name, not ignored.
func TestUnsupportedKairosKeys(t *testing.T) {
	for _, kv := range []string{"env:\n  HTTP_PROXY: http://proxy:3128\n", "import_local_images: true\n", "local_images_path: /x\n", "cluster_config_path: /etc/x.yaml\n"} {
		key := strings.SplitN(kv, ":", 2)[0]
		var s sdk.Cluster
		if err := yaml3.Unmarshal([]byte(good+kv), &s); err != nil {
			t.Fatalf("%s: the SDK refuses it: %v", key, err)
		}
		_, err := Parse([]byte(good + kv))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), key+" is a key of Kairos's cluster schema that provider-kubernetes does not use") {
			t.Errorf("%s: %v", key, err)
		}
	}
	if _, err := Parse([]byte(good + "env:\n")); err != nil {
		t.Errorf("an empty env: %v", err)
	}
}
