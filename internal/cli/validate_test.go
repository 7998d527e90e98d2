package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/reconcile"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
)

// runStdin is run with stdin.
func runStdin(stdin string, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Main(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

// problemLines are the problems of validate's text output.
func problemLines(t *testing.T, out string) []string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) < 2 || !regexp.MustCompile(`: invalid: \d+ problems?$`).MatchString(lines[0]) {
		t.Fatalf("not an invalid file's report:\n%s", out)
	}
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, "  ") {
			t.Fatalf("a problem line %q is not indented:\n%s", l, out)
		}
	}
	return lines[1:]
}

// exampleCloudConfigs are every cloud-config file under examples/: a
// .yaml or .yml file with Kairos's header.
func exampleCloudConfigs(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir("../../examples", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(p) != ".yaml" && filepath.Ext(p) != ".yml" {
			return err
		}
		b, err := os.ReadFile(p)
		if err == nil && clusterconfig.HasCloudConfigHeader(b) {
			out[p] = b
		}
		return err
	})
	if err != nil || len(out) < 3 {
		t.Fatalf("the examples' cloud-configs: %v %v", keysOf(out), err)
	}
	return out
}

func keysOf(m map[string][]byte) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// Every example cloud-config of the repository is refused as shipped for
// its placeholders only, and validates once they are filled in as the
// operator fills them: the examples cannot drift from the checks.
func TestValidateExampleCloudConfigs(t *testing.T) {
	dir := t.TempDir()
	for p, b := range exampleCloudConfigs(t) {
		t.Run(filepath.Base(p), func(t *testing.T) {
			code, out, errOut := run("validate", p)
			if code != reconcile.ExitFailed {
				t.Fatalf("as shipped: exit %d\n%s%s", code, out, errOut)
			}
			for _, l := range problemLines(t, out) {
				if !strings.Contains(l, "cluster_token is still a placeholder") && !strings.Contains(l, "caCertHashes[0] is not sha256:") {
					t.Errorf("as shipped, a problem that is not a placeholder: %s", l)
				}
			}

			filled := filepath.Join(dir, filepath.Base(p))
			if err := os.WriteFile(filled, testutil.FillExample(b, testutil.Token), 0o600); err != nil {
				t.Fatal(err)
			}
			code, out, errOut = run("validate", filled)
			role := strings.TrimSuffix(filepath.Base(p), filepath.Ext(p))
			want := regexp.MustCompile("^" + regexp.QuoteMeta(filled) + ": valid: role " + role + `, pin v1\.\d+\.\d+, providerConfig: budget\.[a-zA-Z]+(, budget\.[a-zA-Z]+)*\n$`)
			if code != reconcile.ExitOK || !want.MatchString(out) || errOut != "" {
				t.Fatalf("filled in: exit %d\n%s%s", code, out, errOut)
			}
			if strings.Contains(out+errOut, testutil.Token) {
				t.Fatal("the output holds the token")
			}
		})
	}
}

// pinnedConfig is a valid cloud-config of role, pinned at v1.37.2, with
// extra lines added to its cluster: section (after its config).
func pinnedConfig(role, extra string) string {
	return testutil.CloudConfig(role, "v1.37.2") + extra
}

// Each broken config exits 1 and lists its one problem.
func TestValidateRefusesBrokenConfigs(t *testing.T) {
	good := pinnedConfig("init", "")
	if code, out, errOut := runStdin(good, "validate", "-"); code != reconcile.ExitOK || out != "(stdin): valid: role init, pin v1.37.2, providerConfig: none\n" || errOut != "" {
		t.Fatalf("the good config: exit %d %q %q", code, out, errOut)
	}
	const pin = "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	joinWith := func(role, discovery string) string {
		return pinnedConfig(role, "    joinConfiguration:\n      discovery:\n        bootstrapToken:\n"+discovery)
	}
	for name, tc := range map[string]struct{ in, want string }{
		"no header":           {strings.TrimPrefix(good, "#cloud-config\n"), "no #cloud-config header"},
		"the header too late": {strings.Repeat("\n", 10) + good, "no #cloud-config header"},
		"no cluster section":  {"#cloud-config\nhostname: cp1\n", "no cluster: section"},
		"not YAML":            {"#cloud-config\ncluster: [\n", "the cloud-config is not YAML"},
		"not a map":           {"#cloud-config\n- cluster\n", "not a map of keys"},
		"role not a string":   {strings.Replace(good, "role: init", "role: [init]", 1), "role must be a string, got a list"},
		"role unknown":        {strings.Replace(good, "role: init", "role: leader", 1), "role is not init, controlplane or worker"},
		"role missing":        {strings.Replace(good, "  role: init\n", "", 1), "role is missing"},
		"key unused":          {pinnedConfig("init", "  env: {A: b}\n"), "env is a key of Kairos's cluster schema"},
		"pin missing":         {strings.Replace(good, "      kubernetesVersion: v1.37.2\n", "", 1), "kubernetesVersion is missing"},
		"pin not exact":       {strings.Replace(good, "v1.37.2", "v1.37", 1), "kubernetesVersion is not an exact vMAJOR.MINOR.PATCH"},
		"pin a number":        {strings.Replace(good, "v1.37.2", "1.37", 1), "kubernetesVersion must be a string"},
		"budget unknown":      {pinnedConfig("init", "  providerConfig:\n    budget.verfy: 6m\n"), "did you mean budget.verify?"},
		"budget bad":          {pinnedConfig("init", "  providerConfig:\n    budget.verify: soon\n"), "budget.verify is not a positive Go duration"},
		"budget above bound":  {pinnedConfig("init", "  providerConfig:\n    budget.etcdSnapshot: 2m1s\n"), "may be lowered, not raised"},
		"token short":         {strings.Replace(good, testutil.Token, "s3cr3t-but-short", 1), "cluster_token is too short (16 characters, at least 20)"},
		"token repetitive":    {strings.Replace(good, testutil.Token, strings.Repeat("ab", 15), 1), "cluster_token is too repetitive (2 distinct characters"},
		"token missing":       {strings.Replace(good, "  cluster_token: "+testutil.Token+"\n", "", 1), "cluster_token is missing"},
		"host missing":        {strings.Replace(good, "  control_plane_host: 10.0.0.11\n", "", 1), "control_plane_host is missing"},
		"CA pin malformed":    {joinWith("worker", "          caCertHashes: [sha256:0]\n"), "caCertHashes[0] is not sha256:<64 lowercase hex digits>"},
		"CA pin skipped":      {joinWith("worker", "          caCertHashes: ["+pin+"]\n          unsafeSkipCAVerification: true\n"), "unsafeSkipCAVerification must not be set"},
		"CA cert not PEM":     {pinnedConfig("worker", "  ca_certs: [not a certificate]\n"), "ca_certs[0]: no PEM CERTIFICATE block"},
		"role conflict": {pinnedConfig("worker", "    joinConfiguration:\n      controlPlane: {}\n      discovery:\n        bootstrapToken:\n          caCertHashes: ["+pin+"]\n"),
			"joinConfiguration.controlPlane is set but the role is worker"},
	} {
		t.Run(name, func(t *testing.T) {
			code, out, errOut := runStdin(tc.in, "validate", "-")
			if code != reconcile.ExitFailed {
				t.Fatalf("exit %d\n%s%s", code, out, errOut)
			}
			if got := problemLines(t, out); len(got) != 1 || !strings.Contains(got[0], tc.want) {
				t.Fatalf("problems %q, want one with %q", got, tc.want)
			}
		})
	}
}

// A config with several problems lists every one, in text and in JSON;
// no value of the config is printed, the token least of all.
func TestValidateListsEveryProblemAndNoValue(t *testing.T) {
	const secret = "Zq8r4Nd0mT0ken9f" // too short for a token
	in := strings.Replace(pinnedConfig("init", "  providerConfig:\n    budget.verify: "+secret+"\n    "+secret+": 1m\n    certificates.renewBefore: "+secret+"\n"), "#cloud-config\n", "", 1)
	in = strings.Replace(in, testutil.Token, secret, 1)
	in = strings.Replace(in, "role: init", "role: "+secret, 1)
	in = strings.Replace(in, "v1.37.2", secret, 1)
	want := []string{"no #cloud-config header", "role is not init", "cluster_token is too short (16 characters",
		"kubernetesVersion is not an exact", "unknown key, a key of 16 characters (not shown)", "budget.verify is not a positive Go duration",
		"certificates.renewBefore is not a positive Go duration"}

	code, out, errOut := runStdin(in, "validate", "-")
	got := problemLines(t, out)
	if code != reconcile.ExitFailed || len(got) != len(want) || !strings.HasPrefix(out, "(stdin): invalid: 7 problems\n") {
		t.Fatalf("exit %d, %d problems, want %d:\n%s%s", code, len(got), len(want), out, errOut)
	}
	for i, w := range want {
		if !strings.Contains(got[i], w) {
			t.Errorf("problem %d: %q, want %q", i, got[i], w)
		}
	}

	code, js, errOut := runStdin(in, "validate", "-o", "json", "-")
	var doc checked
	if err := json.Unmarshal([]byte(js), &doc); err != nil || code != reconcile.ExitFailed || doc.Valid || len(doc.Problems) != len(want) || doc.Role != "" || doc.Pin != "" {
		t.Fatalf("-o json: exit %d %v\n%s%s", code, err, js, errOut)
	}
	for i, p := range doc.Problems {
		if "  "+p != got[i] {
			t.Errorf("-o json's problem %d %q is not the text's %q", i, p, got[i])
		}
	}
	if strings.Contains(out+errOut+js, secret) {
		t.Fatalf("the output quotes a value:\n%s%s", out, js)
	}
}

// A valid config: one line, or one JSON document whose role, pin and
// providerConfig keys are the file's; a warning agent.boot prints goes to
// stderr.
func TestValidateSummary(t *testing.T) {
	in := pinnedConfig("worker", "  providerConfig:\n    budget.waitForCluster: 10m\n    budget.apiRequest: 20s\n")
	code, out, errOut := runStdin(in, "validate", "-")
	if code != reconcile.ExitOK || out != "(stdin): valid: role worker, pin v1.37.2, providerConfig: budget.apiRequest, budget.waitForCluster\n" ||
		!strings.HasPrefix(errOut, "warning: no CA pin") {
		t.Fatalf("exit %d %q %q", code, out, errOut)
	}
	p := filepath.Join(t.TempDir(), "90_custom.yaml")
	if err := os.WriteFile(p, []byte(in), 0o600); err != nil {
		t.Fatal(err)
	}
	code, js, _ := run("validate", "-o", "json", p)
	var doc map[string]any
	if err := json.Unmarshal([]byte(js), &doc); err != nil || code != reconcile.ExitOK {
		t.Fatalf("exit %d %v %s", code, err, js)
	}
	if doc["file"] != p || doc["valid"] != true || doc["role"] != "worker" || doc["pin"] != "v1.37.2" ||
		len(doc["providerConfig"].([]any)) != 2 || len(doc["problems"].([]any)) != 0 || len(doc["warnings"].([]any)) != 1 {
		t.Fatalf("%s", js)
	}
	// The flag after the file reads the same.
	if code, js2, _ := run("validate", p, "-o", "json"); code != reconcile.ExitOK || js2 != js {
		t.Fatalf("exit %d %s", code, js2)
	}
}

// Usage errors exit 2 with one line and a hint; a file that cannot be read
// as a cloud-config (missing, a symlink, a FIFO, too big) exits 1 without
// blocking or following.
func TestValidateUsageAndReads(t *testing.T) {
	for _, args := range [][]string{{"validate"}, {"validate", "-o", "xml", "x.yaml"}, {"validate", "a.yaml", "b.yaml"}} {
		code, out, errOut := run(args...)
		if code != reconcile.ExitUsage || out != "" || len(strings.Split(strings.TrimSpace(errOut), "\n")) != 2 ||
			!strings.Contains(errOut, "run 'provider-kubernetes validate --help'") {
			t.Errorf("%v: exit %d %q %q", args, code, out, errOut)
		}
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(pinnedConfig("init", "")), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.yaml")
	fifo := filepath.Join(dir, "fifo.yaml")
	big := filepath.Join(dir, "big.yaml")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(big, []byte(pinnedConfig("init", "#"+strings.Repeat("x", clusterconfig.MaxCloudConfigFile)+"\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{filepath.Join(dir, "none.yaml"): "no such file", link: "symlink", fifo: "not a regular file",
		big: "kairos-agent skips a cloud-config of 2 MiB or more"} {
		code, out, errOut := run("validate", p)
		if code != reconcile.ExitFailed || out != "" || !strings.HasPrefix(errOut, "validate: ") || !strings.Contains(errOut, want) {
			t.Errorf("%s: exit %d %q %q, want %q", filepath.Base(p), code, out, errOut, want)
		}
	}
	code, _, errOut := runStdin(pinnedConfig("init", "#"+strings.Repeat("x", clusterconfig.MaxCloudConfigFile)+"\n"), "validate", "-")
	if code != reconcile.ExitFailed || !strings.Contains(errOut, "stdin: file too large") {
		t.Errorf("stdin too big: exit %d %q", code, errOut)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 4 {
		t.Fatalf("validate wrote beside the files: %v %v", ents, err)
	}
}

// A key of the cluster section that neither Kairos's schema nor the
// provider reads (a misspelt providerConfig) is ignored by both, so validate
// and agent.boot warn about it: by its line, the known key it looks like,
// never the key itself.
func TestUnknownClusterKeysAreWarnedAbout(t *testing.T) {
	in := pinnedConfig("init", "  providerconfig:\n    budget.verify: 6m\n  \"x\\e]0;owned\\ay\": 1\n")
	lines := strings.Split(in, "\n")
	line := func(prefix string) int {
		for i, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return i + 1
			}
		}
		t.Fatalf("no line %q", prefix)
		return 0
	}
	code, out, errOut := runStdin(in, "validate", "-")
	want1 := fmt.Sprintf("warning: cluster: the key at line %d is not one Kairos's cluster schema or provider-kubernetes reads", line("  providerconfig:"))
	want2 := fmt.Sprintf("warning: cluster: the key at line %d is not one", line("  \"x"))
	if code != reconcile.ExitOK || out != "(stdin): valid: role init, pin v1.37.2, providerConfig: none\n" ||
		!strings.Contains(errOut, want1) || !strings.Contains(errOut, "; did you mean providerConfig?\n") || !strings.Contains(errOut, want2) ||
		strings.Contains(errOut, "providerconfig") || strings.Contains(errOut, "owned") || strings.Count(errOut, "did you mean") != 1 {
		t.Fatalf("exit %d %q\n%s", code, out, errOut)
	}
	// The keys it reads, and those it refuses by name, are not warned about.
	if _, _, errOut := runStdin(pinnedConfig("init", "  providerConfig:\n    budget.verify: 6m\n"), "validate", "-"); errOut != "" {
		t.Fatalf("warned about known keys: %s", errOut)
	}
}
