package pin

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/pkg/version"
)

// Each layout is a cloud-config with %[1]s where the pin's characters are
// (inside whatever quotes the case writes): the edit must turn the file
// with v1.36.3 there into exactly the file with v1.37.2 there, every other
// byte kept.
var layouts = []struct{ name, text string }{
	{"plain", "#cloud-config\ncluster:\n  role: init\n  config: |\n    clusterConfiguration:\n      kubernetesVersion: %[1]s\n"},
	{"single-quoted", "#cloud-config\ncluster:\n  role: init\n  config: |\n    clusterConfiguration:\n      kubernetesVersion: '%[1]s'\n"},
	{"double-quoted", "#cloud-config\ncluster:\n  role: init\n  config: |\n    clusterConfiguration:\n      kubernetesVersion: \"%[1]s\"\n"},
	{"CRLF", "#cloud-config\r\ncluster:\r\n  role: init\r\n  config: |\r\n    clusterConfiguration:\r\n      kubernetesVersion: %[1]s\r\n    initConfiguration:\r\n      nodeRegistration:\r\n        name: cp1\r\n"},
	{"comments everywhere, the old value elsewhere too",
		"# written by hand\n#cloud-config\n# kubernetesVersion: v1.36.3 was the last release\nhostname: cp1 # kubernetesVersion: v1.36.3\ncluster:\n  # the section\n  cluster_token: Zq8-r4Nd0m-cluster-T0ken-9f3a\n" +
			"  config: |   # kubeadm's documents\n    # clusterConfiguration: {kubernetesVersion: v1.36.3}\n    clusterConfiguration:\n      clusterName: v1.36.3\n\n      kubernetesVersion:   %[1]s    # the pin\n" +
			"    initConfiguration:\n      nodeRegistration:\n        kubeletExtraArgs:\n        - name: node-labels\n          value: pinned=v1.36.3\n  role: init\n" +
			"write_files:\n- path: /etc/motd\n  content: |\n    kubernetesVersion: v1.36.3\n"},
	{"other documents after the first", "#cloud-config\ncluster:\n  config: |\n    clusterConfiguration:\n      kubernetesVersion: %[1]s\n---\ncluster:\n  config: |\n    clusterConfiguration:\n      kubernetesVersion: v1.36.3\n...\n"},
	{"keep and strip chomping, explicit indentation", "#cloud-config\ncluster:\n  config: |2+\n      clusterConfiguration:\n        kubernetesVersion: %[1]s\n\n\nstages: {}\n"},
	{"strip chomping, deeper indentation", "#cloud-config\ncluster:\n        config: |-\n                clusterConfiguration:\n                  kubernetesVersion: %[1]s\n"},
	{"a flow map after other characters on the line", "#cloud-config\ncluster:\n  config: |\n    clusterConfiguration: {clusterName: \"ünïcödé-✓\", kubernetesVersion: \"%[1]s\", networking: {}}\n"},
	{"no line feed at the end", "#cloud-config\ncluster:\n  config: |-\n    clusterConfiguration:\n      kubernetesVersion: %[1]s"},
	{"the section not first, tabs in a comment", "#cloud-config\nusers:\n- name: kairos\n  # a comment\t\ncluster:\n  config: |\n    clusterConfiguration:\n      kubernetesVersion: %[1]s # \tpinned\n  role: worker\n"},
}

func TestEditKeepsEveryOtherByte(t *testing.T) {
	to := version.MustParse("v1.37.2")
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			old := fmt.Sprintf(l.text, "v1.36.3")
			want := fmt.Sprintf(l.text, "v1.37.2")
			got, err := Edit([]byte(old), to)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != want {
				t.Fatalf("edited:\n%q\nwant:\n%q", got, want)
			}
			// And back: the edit is its own inverse on these bytes.
			back, err := Edit(got, version.MustParse("v1.36.3"))
			if err != nil || string(back) != old {
				t.Fatalf("back: %v\n%q", err, back)
			}
			if p, ok := pluginPin(got); !ok || p != "v1.37.2" {
				t.Fatalf("the plugin's parser reads %q %v", p, ok)
			}
		})
	}
}

// A value that is not a plain one-line scalar in a literal block, or a
// section where the pin cannot be told for sure, is refused, saying why.
func TestEditRefusesWhatItCannotEditInPlace(t *testing.T) {
	cc := func(body string) string {
		return "#cloud-config\ncluster:\n  config: |\n    clusterConfiguration:\n" + body
	}
	cases := []struct{ name, text, why string }{
		{"an alias", "#cloud-config\nv: &v v1.36.3\ncluster:\n  config: |\n    x: &p v1.36.3\n    clusterConfiguration:\n      kubernetesVersion: *p\n", "clusterConfiguration.kubernetesVersion is an alias"},
		{"an anchor", cc("      kubernetesVersion: &pin v1.36.3\n    kubeletConfiguration:\n      x: *pin\n"), "clusterConfiguration.kubernetesVersion carries an anchor"},
		{"clusterConfiguration an alias", "#cloud-config\ncluster:\n  config: |\n    base: &cc\n      kubernetesVersion: v1.36.3\n    clusterConfiguration: *cc\n", "clusterConfiguration is an alias"},
		{"config an alias", "#cloud-config\nx: &c |\n  clusterConfiguration:\n    kubernetesVersion: v1.36.3\ncluster:\n  config: *c\n", "cluster.config is an alias"},
		{"config anchored", "#cloud-config\ncluster:\n  config: &c |\n    clusterConfiguration:\n      kubernetesVersion: v1.36.3\n", "cluster.config carries an anchor"},
		{"a merge key", cc("      <<: {kubernetesVersion: v1.35.0}\n      kubernetesVersion: v1.36.3\n"), "clusterConfiguration uses a merge key (<<)"},
		{"given twice", cc("      kubernetesVersion: v1.36.3\n      kubernetesVersion: v1.36.3\n"), "clusterConfiguration sets kubernetesVersion 2 times"},
		{"a folded config", "#cloud-config\ncluster:\n  config: >\n    clusterConfiguration:\n\n      kubernetesVersion: v1.36.3\n", "folded block"},
		{"a quoted config", "#cloud-config\ncluster:\n  config: \"clusterConfiguration:\\n  kubernetesVersion: v1.36.3\\n\"\n", "quoted or plain string"},
		{"a literal block value", cc("      kubernetesVersion: |\n        v1.36.3\n"), "spans several lines"},
		{"a plain value over two lines", cc("      kubernetesVersion: v1.36\n        .3\n"), "spans several lines"},
		{"a quoted value over two lines", cc("      kubernetesVersion: \"v1.36\n        .3\"\n"), "spans several lines"},
		{"a tag", cc("      kubernetesVersion: !!str v1.36.3\n"), "explicit tag"},
		{"an escape", cc("      kubernetesVersion: \"v1.36\\x2e3\"\n"), "could not be told apart"},
		{"a doubled quote", cc("      kubernetesVersion: 'v1.36''3'\n"), "could not be told apart"},
		{"absent", cc("      clusterName: c\n"), "clusterConfiguration.kubernetesVersion is not set"},
		{"null", cc("      kubernetesVersion:\n"), "clusterConfiguration.kubernetesVersion is not set"},
		{"a map", cc("      kubernetesVersion: {v: 1}\n"), "is not a single value"},
		{"no clusterConfiguration", "#cloud-config\ncluster:\n  config: |\n    initConfiguration: {}\n", "config has no clusterConfiguration"},
		{"config not YAML", "#cloud-config\ncluster:\n  config: |\n    clusterConfiguration: [\n", "config is not YAML"},
		{"config a map", "#cloud-config\ncluster:\n  config:\n    clusterConfiguration:\n      kubernetesVersion: v1.36.3\n", "config is not a string"},
		{"no section", "#cloud-config\nhostname: a\n", "does not set the cluster: section's config"},
		{"not YAML", "#cloud-config\ncluster: [\n", "not YAML"},
		// The plugin's parser (sigs.k8s.io/yaml, JSON field names matched
		// regardless of case) reads the second of these, which yaml.v3
		// sees as another key.
		{"the pin given twice by case", cc("      kubernetesVersion: v1.36.3\n    clusterconfiguration:\n      kubernetesVersion: v1.35.3\n"), "the plugin reads another clusterConfiguration.kubernetesVersion than this one"},
		{"cluster given twice", "#cloud-config\ncluster:\n  role: init\ncluster:\n  config: |\n    clusterConfiguration:\n      kubernetesVersion: v1.36.3\n", "the cloud-config sets cluster 2 times"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := Edit([]byte(c.text), version.MustParse("v1.37.2"))
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), c.why) || out != nil {
				t.Fatalf("got %v (%q), want a refusal saying %q", err, out, c.why)
			}
			if strings.Contains(err.Error(), "v1.36") || strings.Contains(err.Error(), "v1.35") {
				t.Fatalf("the refusal quotes a value: %v", err)
			}
		})
	}
}

// The value the pin has may be anything the operator wrote (a YAML number
// such as 1.36, which the plugin refuses): setting a version fixes it.
func TestEditReplacesAValueThatIsNotAVersion(t *testing.T) {
	old := "#cloud-config\ncluster:\n  config: |\n    clusterConfiguration:\n      kubernetesVersion: 1.36 # wrong\n"
	got, err := Edit([]byte(old), version.MustParse("v1.36.3"))
	if err != nil || string(got) != strings.Replace(old, "1.36 ", "v1.36.3 ", 1) {
		t.Fatalf("%v\n%q", err, got)
	}
	if p, ok := pluginPin([]byte(old)); ok {
		t.Fatalf("the plugin's parser read %q from a number", p)
	}
}

func TestTarget(t *testing.T) {
	w := version.Window{{Major: 1, Minor: 35}, {Major: 1, Minor: 36}, {Major: 1, Minor: 37}}
	if v, err := Target(w, "v1.37.2"); err != nil || v != version.MustParse("v1.37.2") {
		t.Fatalf("%v %v", v, err)
	}
	for in, want := range map[string]string{
		"v1.34.9":     "v1.34.9 is outside the supported window 1.35, 1.36, 1.37",
		"v1.38.0":     "v1.38.0 is outside the supported window 1.35, 1.36, 1.37",
		"1.37.2":      "the version (<a value of 6 characters, not shown>) is not an exact vMAJOR.MINOR.PATCH release",
		"v1.37":       "the version (<a value of 5 characters, not shown>)",
		"v1.37.2-rc1": "the version (<a value of 11 characters, not shown>)",
		"\x1b[2Jpwn":  "the version (<a value of 7 characters, not shown>)",
	} {
		_, err := Target(w, in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
		if in[0] != 'v' || strings.Count(in, ".") != 2 || strings.Contains(in, "-") {
			if strings.Contains(strings.TrimSuffix(err.Error(), " such as v1.37.2"), in) {
				t.Errorf("%q: the error quotes the value: %v", in, err)
			}
		}
	}
}

// The check before any write catches a result that differs from the
// original anywhere but the pin, or whose pin does not read the target.
func TestCheckCatchesMoreThanThePin(t *testing.T) {
	old := "#cloud-config\nhostname: cp1\ncluster:\n  role: init\n  config: |\n    clusterConfiguration:\n      kubernetesVersion: v1.36.3\n    initConfiguration:\n      nodeRegistration:\n        name: cp1\n"
	v := version.MustParse("v1.37.2")
	good := strings.Replace(old, "v1.36.3", "v1.37.2", 1)
	if err := check([]byte(old), []byte(good), v); err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{
		"another key":                 strings.Replace(good, "hostname: cp1", "hostname: cp2", 1),
		"another kubeadm setting":     strings.Replace(good, "name: cp1", "name: cp2", 1),
		"the section's role":          strings.Replace(good, "role: init", "role: worker", 1),
		"another pin":                 old,
		"the pin moved out of config": strings.Replace(good, "    clusterConfiguration:\n      kubernetesVersion: v1.37.2\n", "", 1),
		"a key added":                 good + "users: []\n",
		// A section the plugin refuses (env is not used) is still checked.
		"another pin, env set":         strings.Replace(old, "  role: init\n", "  role: init\n  env: [a]\n", 1),
		"config's documents reordered": strings.Replace(good, "    clusterConfiguration:\n      kubernetesVersion: v1.37.2\n    initConfiguration:\n      nodeRegistration:\n        name: cp1\n", "    initConfiguration:\n      nodeRegistration:\n        name: cp1\n    clusterConfiguration:\n      kubernetesVersion: v1.37.2\n      clusterName: x\n", 1),
	} {
		base := old
		if strings.Contains(out, "env: [a]") {
			base = strings.Replace(old, "  role: init\n", "  role: init\n  env: [a]\n", 1)
		}
		if err := check([]byte(base), []byte(out), v); err == nil {
			t.Errorf("%s: passed the check", name)
		}
	}
}
