package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	pluggable "github.com/mudler/go-pluggable"
	yip "github.com/mudler/yip/pkg/schema"
	"github.com/twpayne/go-vfs/v5"
	"sigs.k8s.io/yaml"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
	"github.com/kairos-io/provider-kubernetes/internal/plugin"
	"github.com/kairos-io/provider-kubernetes/internal/testutil"
	"github.com/kairos-io/provider-kubernetes/pkg/clusterconfig"
)

// pluginRootEnv makes the test binary itself the plugin process, rooted at
// a sandbox: the tests below execute it with real pipes, as kairos-agent
// executes /system/providers/agent-provider-kubernetes.
const pluginRootEnv = "PROVIDER_KUBERNETES_TEST_PLUGIN_ROOT"

func TestMain(m *testing.M) {
	if root := os.Getenv(pluginRootEnv); root != "" {
		os.Exit(entry(context.Background(), os.Args, root, os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

const (
	pluginToken = "Zq8-r4Nd0m-cluster-T0ken-9f3a"
	pluginKey   = "4f1c9a7e2b8d3f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8"
)

func cloudConfig(cluster string) string {
	return "#cloud-config\nhostname: node1\nusers:\n- name: kairos\n  passwd: kairos\n" + cluster
}

const goodCluster = `cluster:
  cluster_token: ` + pluginToken + `
  control_plane_host: 10.0.0.11
  role: init
  config: |
    clusterConfiguration:
      kubernetesVersion: v1.37.2
    initConfiguration:
      certificateKey: ` + pluginKey + `
      nodeRegistration:
        name: cp1
  providerConfig:
    budget.verify: 6m
`

type pluginRun struct {
	resp   pluggable.EventResponse
	stdout string
	stderr string
	code   int
}

// execPlugin runs the test binary as the plugin with real pipes: argv[0]
// and the event JSON given, the sandbox root from the environment.
func execPlugin(t *testing.T, root, argv0, event string, ev pluggable.Event) pluginRun {
	t.Helper()
	in, _ := json.Marshal(ev)
	cmd := testutil.Command(t, 2*time.Minute, os.Args[0], event)
	cmd.Args[0] = argv0
	cmd.Env = append(os.Environ(), pluginRootEnv+"="+root)
	cmd.Stdin = bytes.NewReader(in)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := pluginRun{stdout: out.String(), stderr: errb.String(), code: cmd.ProcessState.ExitCode()}
	if err != nil && r.code == -1 {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out.Bytes(), &r.resp); err != nil {
		t.Fatalf("stdout is not a go-pluggable response: %v\n%s\nstderr: %s", err, out.String(), errb.String())
	}
	return r
}

func bootEvent(cfg string) pluggable.Event {
	e, _ := pluggable.NewEvent(plugin.EventBoot, map[string]string{"config": cfg})
	return *e
}

func noPluginSecrets(t *testing.T, r pluginRun) {
	t.Helper()
	for name, s := range map[string]string{"stdout": r.stdout, "stderr": r.stderr, "log": r.resp.Logs} {
		for _, secret := range []string{pluginToken, pluginKey, "0123456789abcdef"} {
			if strings.Contains(s, secret) {
				t.Fatalf("%s carries a secret:\n%s", name, s)
			}
		}
	}
}

// loadYip parses the written file with yip's own schema package, as Kairos does.
func loadYip(t *testing.T, b []byte) *yip.YipConfig {
	t.Helper()
	cfg, err := yip.Load(string(b), vfs.OSFS, nil, nil)
	if err != nil {
		t.Fatalf("yip: %v", err)
	}
	return cfg
}

func checkYip(t *testing.T, root string, wantSection *clusterconfig.Cluster) {
	t.Helper()
	p := filepath.Join(root, paths.ClusterYipFile)
	st, err := os.Lstat(p)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v %v", paths.ClusterYipFile, st, err)
	}
	b, _ := os.ReadFile(p)
	if !strings.HasPrefix(string(b), "#cloud-config\n") {
		t.Fatalf("no #cloud-config header:\n%s", b)
	}
	cfg := loadYip(t, b)
	// The cloud-init transpiler adds its own empty entries; ours are the named ones.
	var named []yip.Stage
	for _, s := range cfg.Stages["boot"] {
		if strings.HasPrefix(s.Name, "provider-kubernetes") {
			named = append(named, s)
		}
	}
	if len(named) != 2 {
		t.Fatalf("boot stages %+v", cfg.Stages)
	}
	files := named[0].Files
	if len(files) != 1 || files[0].Path != paths.ClusterFile || files[0].Permissions != 0o600 || files[0].Owner != 0 || files[0].Group != 0 {
		t.Fatalf("files %+v", files)
	}
	if d := named[0].Directories; len(d) != 1 || d[0].Path != paths.RunDir || d[0].Permissions != 0o755 {
		t.Fatalf("directories %+v", d)
	}
	if c := named[1].Commands; len(c) != 1 || c[0] != "systemctl start --no-block provider-kubernetes-reconcile.service" {
		t.Fatalf("commands %q", c)
	}
	// The cluster file the boot stage writes is the section, as the reconcile reads it.
	got, err := clusterconfig.Parse([]byte(files[0].Content))
	if err != nil {
		t.Fatal(err)
	}
	if got.ClusterToken != wantSection.ClusterToken || got.Role != wantSection.Role || got.Config != wantSection.Config ||
		got.ControlPlaneHost != wantSection.ControlPlaneHost || fmt.Sprint(got.ProviderConfig) != fmt.Sprint(wantSection.ProviderConfig) {
		t.Fatalf("cluster file %+v\nwant %+v", got, wantSection)
	}
	if _, err := got.Validate(); err != nil {
		t.Fatal(err)
	}
}

func parseWant(t *testing.T, cluster string) *clusterconfig.Cluster {
	t.Helper()
	var doc map[string]json.RawMessage
	if err := yaml.Unmarshal([]byte(cluster), &doc); err != nil {
		t.Fatal(err)
	}
	b, _ := yaml.JSONToYAML(doc["cluster"])
	c, err := clusterconfig.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPluginBootThroughTheRealProtocol(t *testing.T) {
	for _, tc := range []struct{ name, argv0, event string }{
		{"installed as agent-provider-kubernetes", "/system/providers/agent-provider-kubernetes", "agent.boot"},
		{"event name first", "/usr/bin/provider-kubernetes", "agent.boot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			r := execPlugin(t, root, tc.argv0, tc.event, bootEvent(cloudConfig(goodCluster)))
			if r.code != 0 || r.resp.Error != "" {
				t.Fatalf("exit %d error %q stderr %q", r.code, r.resp.Error, r.stderr)
			}
			if !strings.Contains(r.resp.Logs, "cluster section valid (role init") {
				t.Fatalf("log %q", r.resp.Logs)
			}
			noPluginSecrets(t, r)
			checkYip(t, root, parseWant(t, goodCluster))
			if _, err := os.Lstat(filepath.Join(root, paths.ClusterFile)); err == nil {
				t.Fatal("the plugin wrote the cluster file itself: that is the boot stage's job")
			}
		})
	}
}

// kairos-agent's own client (go-pluggable Plugin.Run) sends data over
// 8 KiB through a temporary file: the plugin reads it from there.
func TestPluginBootOverEightKiBThroughTheFile(t *testing.T) {
	root := t.TempDir()
	big := cloudConfig(goodCluster) + "write_files:\n- path: /etc/motd\n  content: |\n" + strings.Repeat("    a line of a large cloud-config that pushes the payload over eight KiB\n", 200)
	if len(big) < 9000 {
		t.Fatal("payload too small")
	}
	link := filepath.Join(t.TempDir(), plugin.BinaryName)
	if err := os.Symlink(os.Args[0], link); err != nil {
		t.Fatal(err)
	}
	t.Setenv(pluginRootEnv, root)
	resp, err := pluggable.Plugin{Name: "kubernetes", Executable: link}.Run(bootEvent(big))
	if err != nil || resp.Error != "" {
		t.Fatalf("%v %q", err, resp.Error)
	}
	checkYip(t, root, parseWant(t, goodCluster))
	for _, s := range []string{resp.Logs, resp.Data, resp.State} {
		if strings.Contains(s, pluginToken) || strings.Contains(s, pluginKey) {
			t.Fatalf("response carries a secret: %+v", resp)
		}
	}
}

// The file form is read bounded and never through a symlink.
func TestPluginRefusesASymlinkedEventFile(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "data")
	b, _ := json.Marshal(map[string]string{"config": cloudConfig(goodCluster)})
	if err := os.WriteFile(real, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(dir, "pluggable123")); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	r := execPlugin(t, root, "/system/providers/"+plugin.BinaryName, "agent.boot", pluggable.Event{Name: plugin.EventBoot, File: filepath.Join(dir, "pluggable123")})
	if r.code == 0 || !strings.Contains(r.resp.Error, "read the event's data file") {
		t.Fatalf("%+v", r)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("wrote %v", entries)
	}
}

func inventoryOf(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil {
			b, _ := os.ReadFile(p)
			out = append(out, p+" "+string(b))
		}
		return nil
	})
	sort.Strings(out)
	return out
}

// Each bad section: one clear error naming the key, the previous config
// untouched, nothing written, no secret anywhere.
func TestPluginBootRejectsBadSections(t *testing.T) {
	section := func(lines ...string) string { return "cluster:\n  " + strings.Join(lines, "\n  ") + "\n" }
	tok := "cluster_token: " + pluginToken
	host := "control_plane_host: 10.0.0.11"
	cfg := "config: |\n    clusterConfiguration:\n      kubernetesVersion: v1.37.2\n    initConfiguration:\n      certificateKey: " + pluginKey
	for _, tc := range []struct{ name, cluster, want string }{
		{"missing role", section(tok, host, cfg), "role is missing"},
		{"short token", section("cluster_token: abc123", host, "role: init", cfg), "cluster_token is too short"},
		{"map instead of string for config", section(tok, host, "role: init", "config:\n    clusterConfiguration:\n      kubernetesVersion: v1.37.2"),
			"config must be a YAML string holding the kubeadm documents by key"},
		{"unknown role", section(tok, host, "role: master", cfg), "role is not init, controlplane or worker"},
		{"endpoint without a host", section(tok, `control_plane_host: ":6443"`, "role: worker", cfg), "control_plane_host: no host"},
		{"invalid YAML in config", section(tok, host, "role: init", "config: |\n    clusterConfiguration:\n      kubernetesVersion: v1.37.2\n     certificateKey: ["+pluginKey), "config: "},
		{"cluster not a map", "cluster: [a, b]\n", "cluster: must be a map"},
		{"nested providerConfig (not Kairos's schema)", section(tok, host, "role: init", cfg, "providerConfig:\n    budgets:\n      verify: 6m"),
			"providerConfig is a flat map of strings (Kairos's schema); the value of budgets is not a string: write each budget as its own key, budget.<name>: <duration>"},
		{"unknown providerConfig key", section(tok, host, "role: init", cfg, "providerConfig:\n    budget.verfy: 6m"), "providerConfig has an unknown key, a key of 12 characters (not shown; did you mean budget.verify?)"},
		{"bad budget value", section(tok, host, "role: init", cfg, "providerConfig:\n    budget.verify: "+pluginToken), "providerConfig budget.verify is not a positive Go duration"},
		{"snapshot budget above two minutes", section(tok, host, "role: init", cfg, "providerConfig:\n    budget.etcdSnapshot: 5m"), "may be lowered, not raised"},
		{"worker asking for a control plane", section(tok, host, "role: worker", "config: |\n    clusterConfiguration:\n      kubernetesVersion: v1.37.2\n    joinConfiguration:\n      controlPlane: {}"),
			"joinConfiguration.controlPlane is set but the role is worker"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			prev := filepath.Join(root, paths.ClusterYipFile)
			if err := os.MkdirAll(filepath.Dir(prev), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(prev, []byte("#cloud-config\n# the previous config\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			before := inventoryOf(t, root)
			r := execPlugin(t, root, "/system/providers/"+plugin.BinaryName, "agent.boot", bootEvent(cloudConfig(tc.cluster)))
			if r.code != 0 || !strings.Contains(r.resp.Error, tc.want) || !strings.HasPrefix(r.resp.Error, "agent.boot: ") {
				t.Fatalf("exit %d error %q, want %q", r.code, r.resp.Error, tc.want)
			}
			if strings.Contains(r.resp.Error, "\n") || strings.Count(r.resp.Error, "agent.boot:") != 1 {
				t.Fatalf("not one clear error: %q", r.resp.Error)
			}
			noPluginSecrets(t, r)
			// This boot runs the previous section: the refusal is kept for
			// the reconcile pass to report, and nothing else changes.
			marker := filepath.Join(root, paths.PluginError)
			st, err := os.Lstat(marker)
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("%s: %v %v", paths.PluginError, st, err)
			}
			if b, _ := os.ReadFile(marker); string(b) != r.resp.Error+"\n" {
				t.Fatalf("%s holds %q, want the response's error", paths.PluginError, b)
			}
			if err := os.RemoveAll(filepath.Join(root, "run")); err != nil {
				t.Fatal(err)
			}
			if after := inventoryOf(t, root); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("files changed:\n%v\n%v", before, after)
			}
		})
	}
}

// A refused section's record goes once a section is accepted again.
func TestPluginBootClearsTheRecordedRefusal(t *testing.T) {
	root := t.TempDir()
	r := execPlugin(t, root, "/system/providers/"+plugin.BinaryName, "agent.boot", bootEvent(cloudConfig(strings.Replace(goodCluster, "role: init", "role: master", 1))))
	if r.resp.Error == "" {
		t.Fatal("a bad role accepted")
	}
	marker := filepath.Join(root, paths.PluginError)
	if _, err := os.Lstat(marker); err != nil {
		t.Fatal(err)
	}
	r = execPlugin(t, root, "/system/providers/"+plugin.BinaryName, "agent.boot", bootEvent(cloudConfig(goodCluster)))
	if r.resp.Error != "" {
		t.Fatal(r.resp.Error)
	}
	if _, err := os.Lstat(marker); !os.IsNotExist(err) {
		t.Fatalf("%s survived an accepted section: %v", paths.PluginError, err)
	}
}

func TestPluginBootWithoutAClusterSectionDoesNothing(t *testing.T) {
	root := t.TempDir()
	r := execPlugin(t, root, "/system/providers/"+plugin.BinaryName, "agent.boot", bootEvent(cloudConfig("")))
	if r.code != 0 || r.resp.Error != "" || !strings.Contains(r.resp.Logs, "nothing to do") {
		t.Fatalf("%+v", r)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("wrote %v", entries)
	}
}

// The cluster: section removed from the cloud-config: the previous boot's
// yip config goes too, so its boot stage no longer writes the old section
// and starts passes.
func TestPluginBootRemovesTheYipConfigWhenTheSectionIsGone(t *testing.T) {
	root := t.TempDir()
	r := execPlugin(t, root, "/system/providers/"+plugin.BinaryName, "agent.boot", bootEvent(cloudConfig(goodCluster)))
	if r.code != 0 || r.resp.Error != "" {
		t.Fatalf("%+v", r)
	}
	yipFile := filepath.Join(root, paths.ClusterYipFile)
	if _, err := os.Lstat(yipFile); err != nil {
		t.Fatal(err)
	}
	r = execPlugin(t, root, "/system/providers/"+plugin.BinaryName, "agent.boot", bootEvent(cloudConfig("")))
	if r.code != 0 || r.resp.Error != "" || !strings.Contains(r.resp.Logs, "removed the previous "+paths.ClusterYipFile) {
		t.Fatalf("%+v", r)
	}
	if _, err := os.Lstat(yipFile); !os.IsNotExist(err) {
		t.Fatalf("the old yip config is still there: %v", err)
	}
	// A directory planted there is not removed and fails the event.
	if err := os.Mkdir(yipFile, 0o700); err != nil {
		t.Fatal(err)
	}
	r = execPlugin(t, root, "/system/providers/"+plugin.BinaryName, "agent.boot", bootEvent(cloudConfig("")))
	if !strings.Contains(r.resp.Error, "cannot be removed") {
		t.Fatalf("%+v", r)
	}
	if st, err := os.Lstat(yipFile); err != nil || !st.IsDir() {
		t.Fatalf("%v %v", st, err)
	}
}

// Installed as the plugin, events it does not handle get an empty answer.
func TestPluginIgnoresOtherEvents(t *testing.T) {
	root := t.TempDir()
	r := execPlugin(t, root, "/system/providers/"+plugin.BinaryName, "agent.install", pluggable.Event{Name: "agent.install", Data: "{}"})
	if r.code != 0 || r.resp != (pluggable.EventResponse{}) {
		t.Fatalf("%+v", r)
	}
}

// cluster.reset runs the reset: kubeadm through the runner (a recording
// stub in the sandbox: the real one would reset this machine), the
// directories emptied, the status and the response say Reset.
func TestPluginClusterReset(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("kubeadm fails=%v", fail), func(t *testing.T) {
			root := t.TempDir()
			exit := "0"
			if fail {
				exit = "3"
			}
			write := func(p, content string, mode os.FileMode) {
				full := filepath.Join(root, p)
				if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(full, []byte(content), mode); err != nil {
					t.Fatal(err)
				}
			}
			write(paths.Kubeadm, "#!/bin/sh\necho \"$@\" > \"$(dirname \"$0\")/kubeadm.args\"\necho 'reset failed' >&2\nexit "+exit+"\n", 0o755)
			write(paths.AdminConf, "admin\n", 0o600)
			write(paths.EtcdManifest, "etcd\n", 0o600)
			write(paths.KubeletDir+"/config.yaml", "kubelet\n", 0o600)
			write(paths.EtcdBackupDir+"/snap.db", "snap\n", 0o600)
			r := execPlugin(t, root, "/system/providers/"+plugin.BinaryName, "cluster.reset", pluggable.Event{Name: plugin.EventReset, Data: "{}"})
			if b, err := os.ReadFile(filepath.Join(root, "/usr/bin/kubeadm.args")); err != nil || string(b) != "reset -f\n" {
				t.Fatalf("kubeadm ran with %q %v", b, err)
			}
			if entries, _ := os.ReadDir(filepath.Join(root, paths.KubernetesDir)); len(entries) != 0 {
				t.Fatalf("left %v", entries)
			}
			if _, err := os.Stat(filepath.Join(root, paths.EtcdBackupDir, "snap.db")); err != nil {
				t.Fatal("the snapshot was removed")
			}
			if !strings.Contains(r.resp.Logs, "msg=reset-warning") {
				t.Fatalf("log %q", r.resp.Logs)
			}
			if fail {
				if r.resp.State != "ResetFailed" || !strings.Contains(r.resp.Error, "cluster.reset: KubeadmResetFailed") || !strings.Contains(r.resp.Error, "reset failed") {
					t.Fatalf("%+v", r.resp)
				}
				return
			}
			if r.code != 0 || r.resp.State != "Reset" || r.resp.Error != "" || !strings.Contains(r.resp.Logs, "msg=reset outcome=reset") {
				t.Fatalf("%+v", r)
			}
		})
	}
}

// A passphrase-style token (words and dashes: a plain name to any regexp)
// pasted as the role, the pin, a providerConfig key or a key of config is
// refused at boot and described: it reaches neither the response, stdout,
// stderr nor the recorded refusal the next pass copies into its status.
func TestPluginBootNeverEchoesAPastedPassphrase(t *testing.T) {
	const secret = "correct-horse-battery-staple-galaxy"
	for name, cluster := range map[string]string{
		"role":                                   strings.Replace(goodCluster, "role: init", "role: "+secret, 1),
		"pin":                                    strings.Replace(goodCluster, "kubernetesVersion: v1.37.2", "kubernetesVersion: "+secret, 1),
		"providerConfig key":                     strings.Replace(goodCluster, "budget.verify: 6m", secret+": 6m", 1),
		"providerConfig key, value not a string": strings.Replace(goodCluster, "budget.verify: 6m", secret+": [6m]", 1),
		"config key":                             strings.Replace(goodCluster, "    initConfiguration:", "    "+secret+": {}\n    initConfiguration:", 1),
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			r := execPlugin(t, root, "/system/providers/"+plugin.BinaryName, "agent.boot", bootEvent(cloudConfig(cluster)))
			if r.resp.Error == "" {
				t.Fatal("accepted")
			}
			marker, _ := os.ReadFile(filepath.Join(root, paths.PluginError))
			for what, s := range map[string]string{"error": r.resp.Error, "log": r.resp.Logs, "stdout": r.stdout, "stderr": r.stderr, "record": string(marker)} {
				if strings.Contains(s, secret) || strings.Contains(s, "correct-horse") {
					t.Errorf("%s quotes the value: %s", what, s)
				}
			}
			if len(marker) == 0 {
				t.Error("the refusal is not recorded")
			}
		})
	}
}

// agent.boot accepts a section with a key nobody reads and says so in its
// log (the warning validate prints), naming no key.
func TestPluginBootWarnsAboutAnIgnoredKey(t *testing.T) {
	root := t.TempDir()
	r := execPlugin(t, root, "/system/providers/"+plugin.BinaryName, "agent.boot", bootEvent(cloudConfig(goodCluster+"  provider_config:\n    budget.verify: 6m\n")))
	if r.resp.Error != "" || !strings.Contains(r.resp.Logs+r.stdout+r.stderr, "provider-kubernetes: warning: cluster: the key at line ") ||
		!strings.Contains(r.resp.Logs+r.stdout+r.stderr, "did you mean providerConfig?") || strings.Contains(r.resp.Logs+r.stdout+r.stderr, "provider_config") {
		t.Fatalf("%+v", r)
	}
}
