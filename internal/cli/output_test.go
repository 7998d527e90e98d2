package cli

import (
	"context"
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/status"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
)

// Every command whose FlagSet has -o (as it really parses it) refuses a
// format outside text, json and yaml the same way, a usage error naming
// what is allowed, and its synopsis offers exactly those.
func TestEveryOutputFlagIsTheSame(t *testing.T) {
	var with []string
	for _, c := range commands {
		f := flagsOf(context.Background(), c).Lookup("o")
		if f == nil {
			continue
		}
		with = append(with, c.name)
		if f.DefValue != "text" || f.Usage != "output: text, json or yaml" {
			t.Errorf("%s -o: default %q, usage %q", c.name, f.DefValue, f.Usage)
		}
		for _, s := range helps[c.name].synopsis {
			if strings.Contains(s, "-o ") && !strings.Contains(s, "[-o text|json|yaml]") {
				t.Errorf("%s's synopsis %q does not offer -o text|json|yaml", c.name, s)
			}
		}
		args := []string{c.name, "-o", "xml"}
		if c.name == "pin" {
			args = []string{"pin", "show", "-o", "xml"}
		}
		code, out, errOut := runStdin("", args...)
		want := "-o must be text, json or yaml, got <a value of 3 characters, not shown>\nrun 'provider-kubernetes " + c.name + " --help'\n"
		if code != reconcile.ExitUsage || out != "" || errOut != want {
			t.Errorf("%v: exit %d %q %q, want 2 and %q", args, code, out, errOut, want)
		}
	}
	if got := strings.Join(with, " "); got != "plan preflight status validate version" {
		t.Errorf("the commands with -o are %s", got)
	}
}

// Each report prints in each format: json and yaml carry the same
// document (yaml with json's field names), text is for a person.
func TestEveryReportInEveryFormat(t *testing.T) {
	n := testutil.NewNode(t, "cp1")
	if err := status.Write(paths.Root(n.Root), status.Document{Phase: status.PhaseConverged, Pin: "v1.37.2", Message: "a <b> & c"}); err != nil {
		t.Fatal(err)
	}
	api := testutil.NewAPI(t, "v1.37.2")
	n.Admin(api)
	api.SetNode("cp1", "v1.37.2", true)
	valid := testutil.CloudConfig("init", "v1.37.2")
	cases := []struct {
		stdin string
		args  []string
		code  int
		text  string
	}{
		{"", []string{"version"}, reconcile.ExitOK, "provider-kubernetes "},
		{"", []string{"plan", "--root", n.Root, "--pin", "v1.37.2", "--bundled", "v1.37.2", "--node-version", "v1.36.3",
			"--cluster-version", "v1.36.3", "--role", "controlplane", "--member"}, reconcile.ExitOK, "Verdict:  act"},
		{"", []string{"preflight", "--host-root", n.Root, "--image-root", n.Root}, reconcile.ExitOK, "Preflight: "},
		{"", []string{"status", "--root", n.Root}, reconcile.ExitOK, "Phase:"},
		{"", []string{"status", "--cluster", "--root", n.Root}, reconcile.ExitOK, "NODE"},
		{valid, []string{"validate", "-"}, reconcile.ExitOK, "(stdin): valid"},
	}
	for _, c := range cases {
		code, text, errOut := runStdin(c.stdin, append(c.args, "-o", "text")...)
		if code != c.code || !strings.Contains(text, c.text) {
			t.Fatalf("%v -o text: exit %d, want %d and %q:\n%s%s", c.args, code, c.code, c.text, text, errOut)
		}
		code, js, errOut := runStdin(c.stdin, append(c.args, "-o", "json")...)
		var fromJSON map[string]any
		if err := json.Unmarshal([]byte(js), &fromJSON); err != nil || code != c.code || len(fromJSON) == 0 {
			t.Fatalf("%v -o json: exit %d %v\n%s%s", c.args, code, err, js, errOut)
		}
		code, ym, errOut := runStdin(c.stdin, append(c.args, "-o", "yaml")...)
		var fromYAML map[string]any
		if err := yaml.Unmarshal([]byte(ym), &fromYAML); err != nil || code != c.code {
			t.Fatalf("%v -o yaml: exit %d %v\n%s%s", c.args, code, err, ym, errOut)
		}
		if c.args[0] == "status" && c.args[1] == "--cluster" {
			// Its nodes' ages tick between the runs.
			delete(fromJSON, "nodes")
			delete(fromYAML, "nodes")
		}
		if !reflect.DeepEqual(fromJSON, fromYAML) {
			t.Errorf("%v: -o json and -o yaml differ:\n%s\n%s", c.args, js, ym)
		}
	}
	// JSON is the document as written: no HTML escaping.
	if _, js, _ := run("status", "--root", n.Root, "-o", "json"); !strings.Contains(js, `"a <b> & c"`) {
		t.Errorf("status -o json: %s", js)
	}
}

// plan -o json carries what the text shows: every fact of its Facts line
// (and the verified version given), each Observed line as a note.
func TestPlanJSONCarriesTheTextsFacts(t *testing.T) {
	n := testutil.NewNode(t, "n1")
	n.ClusterFile("worker", "v1.36.3", "")
	for _, args := range [][]string{
		{"--pin", "v1.37.2", "--bundled", "v1.37.3", "--node-version", "v1.36.3", "--cluster-version", "v1.37.1",
			"--role", "controlplane", "--member", "--verified", "v1.36.2"},
		{"--pin", "v1.37", "--bundled", "unknown", "--role", "init", "--member=false"},
		{}, // from the node: no bundle, no kubelet, no API (notes say why)
	} {
		args = append([]string{"plan", "--root", n.Root}, args...)
		_, text, _ := run(args...)
		_, js, _ := run(append(args, "-o", "json")...)
		var got struct {
			Verdict string
			Facts   map[string]any
			Notes   []string
		}
		if err := json.Unmarshal([]byte(js), &got); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, js)
		}
		var line string
		var observed []string
		for _, l := range strings.Split(text, "\n") {
			if v, ok := strings.CutPrefix(l, "Facts:    "); ok {
				line = v
			}
			if v, ok := strings.CutPrefix(l, "Observed: "); ok {
				observed = append(observed, v)
			}
		}
		shown := map[string]any{}
		// key=value pairs, a described value holding spaces.
		keys := regexp.MustCompile(` ?\b([a-z]+)=`).FindAllStringSubmatchIndex(line, -1)
		for i, m := range keys {
			end := len(line)
			if i+1 < len(keys) {
				end = keys[i+1][0]
			}
			shown[line[m[2]:m[3]]] = line[m[1]:end]
		}
		// Every fact the JSON carries is on the text's line.
		if len(shown) != len(got.Facts) {
			t.Fatalf("%v: text's facts %q, json's %v", args, line, got.Facts)
		}
		for k, v := range shown {
			j := got.Facts[k]
			if b, ok := j.(bool); ok {
				j = map[bool]string{true: "true", false: "false"}[b]
			}
			if j == "" {
				j = map[string]string{"role": "-", "pin": "(not set)"}[k]
			}
			if j != v {
				t.Errorf("%v: text shows %s=%v, json %v\n%s", args, k, v, got.Facts[k], js)
			}
		}
		if len(args) == 3 && len(observed) == 0 {
			t.Fatalf("%v: read from the node, no Observed line:\n%s", args, text)
		}
		if strings.Join(got.Notes, "\n") != strings.Join(observed, "\n") {
			t.Errorf("%v: notes %q, text's Observed %q", args, got.Notes, observed)
		}
	}
	_, js, _ := run("plan", "--root", n.Root, "-o", "json", "--pin", "v1.37.2", "--bundled", "v1.37.2", "--node-version", "v1.36.3",
		"--cluster-version", "v1.36.3", "--role", "controlplane", "--member", "--verified", "v1.36.2")
	if !strings.Contains(js, `"verified": "v1.36.2"`) {
		t.Errorf("plan -o json drops --verified:\n%s", js)
	}
}
