package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	sdkbus "github.com/kairos-io/kairos-sdk/bus"
	pluggable "github.com/mudler/go-pluggable"

	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

func bundleYAML(kubeadm string) string {
	return "kubernetes: " + kubeadm + "\nkubeadm: " + kubeadm + "\nkubelet: " + kubeadm + "\netcd: 3.7.0-0\n"
}

// softwareVersion is what kairos-init v0.16.4 (pkg/stages/steps_init.go,
// getProviderInfo and the kairos-release stage) makes of a provider's
// answer: an errored answer is skipped, the data is decoded into kairos-sdk's
// bus.ProviderInstalledVersionPayload, and both keys are written only when
// provider and version are set.
func softwareVersion(resp pluggable.EventResponse) map[string]string {
	if resp.Errored() || resp.State == sdkbus.EventResponseNotApplicable {
		return nil
	}
	var p sdkbus.ProviderInstalledVersionPayload
	if err := json.Unmarshal([]byte(resp.Data), &p); err != nil || p.Provider == "" || p.Version == "" {
		return nil
	}
	return map[string]string{"KAIROS_SOFTWARE_VERSION_PREFIX": p.Provider, "KAIROS_SOFTWARE_VERSION": p.Version}
}

// init.provider.info, as kairos-init publishes it (data null), answers the
// provider and the bundled kubeadm's version read from the image's bundle
// manifest under the root; without a manifest naming an exact release it
// answers an error and no version, never a guess, and never quotes what
// the manifest holds. The manifest is read without following a symlink in
// any component and without blocking on what is not a regular file.
func TestProviderInfo(t *testing.T) {
	manifest := paths.BundleManifest
	for _, tc := range []struct {
		name    string
		setup   func(t *testing.T, root string)
		want    string // the response's data, exactly
		errHas  string // the response's error contains it ("" for none)
		errNot  string // the response's error does not contain it
		version string // what kairos-init writes as KAIROS_SOFTWARE_VERSION
	}{
		{
			name:    "manifest at v1.36.3",
			setup:   func(t *testing.T, root string) { writeHost(t, root, manifest, bundleYAML("v1.36.3")) },
			want:    `{"provider":"k8s","version":"v1.36.3"}`,
			version: "v1.36.3",
		},
		{
			name:    "manifest at v1.37.2",
			setup:   func(t *testing.T, root string) { writeHost(t, root, manifest, bundleYAML("v1.37.2")) },
			want:    `{"provider":"k8s","version":"v1.37.2"}`,
			version: "v1.37.2",
		},
		{
			name:   "no manifest",
			setup:  func(t *testing.T, root string) {},
			errHas: "init.provider.info: no bundle manifest at " + manifest,
		},
		{
			name:   "no manifest, its directory there",
			setup:  func(t *testing.T, root string) { mkdirHost(t, root, filepath.Dir(manifest)) },
			errHas: "init.provider.info: no bundle manifest at " + manifest,
		},
		{
			name:   "invalid kubeadm version",
			setup:  func(t *testing.T, root string) { writeHost(t, root, manifest, bundleYAML("v1.37.2-rc.1\x1b[2J")) },
			errHas: "init.provider.info: " + manifest + " is not a valid bundle manifest",
			errNot: "rc.1",
		},
		{
			name:   "kubeadm without the v",
			setup:  func(t *testing.T, root string) { writeHost(t, root, manifest, bundleYAML("1.37.2")) },
			errHas: "is not a valid bundle manifest",
			errNot: "1.37.2",
		},
		{
			name:   "not YAML",
			setup:  func(t *testing.T, root string) { writeHost(t, root, manifest, "kubeadm: [v1.37.2\x00secretish") },
			errHas: "is not a valid bundle manifest",
			errNot: "secretish",
		},
		{
			name: "manifest is a symlink",
			setup: func(t *testing.T, root string) {
				writeHost(t, root, "/elsewhere/bundle.yaml", bundleYAML("v1.37.2"))
				mkdirHost(t, root, filepath.Dir(manifest))
				if err := os.Symlink(filepath.Join(root, "elsewhere", "bundle.yaml"), filepath.Join(root, manifest)); err != nil {
					t.Fatal(err)
				}
			},
			errHas: "init.provider.info: " + manifest + ": a symlink (the manifest or a directory above it) is not followed",
		},
		{
			name: "a directory above it is a symlink",
			setup: func(t *testing.T, root string) {
				writeHost(t, root, "/elsewhere/bundle.yaml", bundleYAML("v1.37.2"))
				mkdirHost(t, root, filepath.Dir(filepath.Dir(manifest)))
				if err := os.Symlink(filepath.Join(root, "elsewhere"), filepath.Join(root, filepath.Dir(manifest))); err != nil {
					t.Fatal(err)
				}
			},
			errHas: "init.provider.info: " + manifest + ": a symlink (the manifest or a directory above it) is not followed",
		},
		{
			name: "manifest is a FIFO",
			setup: func(t *testing.T, root string) {
				mkdirHost(t, root, filepath.Dir(manifest))
				fifo := filepath.Join(root, manifest)
				if err := syscall.Mkfifo(fifo, 0o644); err != nil {
					t.Fatal(err)
				}
				// A read that blocked on the FIFO is let go after 5s (a
				// writer opens and closes it: EOF), so the case fails
				// instead of hanging the package's tests.
				done := make(chan struct{})
				t.Cleanup(func() { close(done) })
				go func() {
					select {
					case <-done:
					case <-time.After(5 * time.Second):
						if fd, err := syscall.Open(fifo, syscall.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
							syscall.Close(fd)
						}
					}
				}()
			},
			errHas: manifest + " is a FIFO, not a regular file",
		},
		{
			name: "manifest over 1 MiB",
			setup: func(t *testing.T, root string) {
				writeHost(t, root, manifest, bundleYAML("v1.37.2")+"#"+strings.Repeat(" ", MaxBundleSize))
			},
			errHas: "file too large",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tc.setup(t, root)
			resp := serveInfo(t, root)
			if resp.Data != tc.want {
				t.Errorf("data %q, want %q", resp.Data, tc.want)
			}
			if tc.errHas == "" && resp.Error != "" {
				t.Errorf("error %q, want none", resp.Error)
			}
			if tc.errHas != "" && !strings.Contains(resp.Error, tc.errHas) {
				t.Errorf("error %q, want it to contain %q", resp.Error, tc.errHas)
			}
			if tc.errNot != "" && strings.Contains(resp.Error, tc.errNot) {
				t.Errorf("error %q quotes the manifest (%q)", resp.Error, tc.errNot)
			}
			wantState := sdkbus.EventResponseSuccess
			if tc.errHas != "" {
				wantState = sdkbus.EventResponseError
			}
			if resp.State != wantState {
				t.Errorf("state %q, want %q", resp.State, wantState)
			}
			got := softwareVersion(resp)
			switch {
			case tc.version == "" && got != nil:
				t.Errorf("kairos-init would write %v, want no version", got)
			case tc.version != "" && (got["KAIROS_SOFTWARE_VERSION_PREFIX"] != "k8s" || got["KAIROS_SOFTWARE_VERSION"] != tc.version):
				t.Errorf("kairos-init would write %v, want k8s %s", got, tc.version)
			}
		})
	}
}

// The event is one the provider handles, also when run as provider-kubernetes.
func TestProviderInfoIsAnEvent(t *testing.T) {
	if string(EventInfo) != "init.provider.info" || !IsEvent("init.provider.info") {
		t.Fatalf("event %q, IsEvent %v", EventInfo, IsEvent("init.provider.info"))
	}
}

// serveInfo sends init.provider.info as kairos-init's bus does and decodes
// the response.
func serveInfo(t *testing.T, root string) pluggable.EventResponse {
	t.Helper()
	ev, err := pluggable.NewEvent(sdkbus.InitProviderInfo, nil)
	if err != nil {
		t.Fatal(err)
	}
	in, _ := json.Marshal(ev)
	var out bytes.Buffer
	if err := Serve(context.Background(), Options{Root: paths.Root(root)}, string(sdkbus.InitProviderInfo), bytes.NewReader(in), &out); err != nil {
		t.Fatalf("serve: %v (%s)", err, out.String())
	}
	var resp pluggable.EventResponse
	if err := json.Unmarshal(out.Bytes(), &resp); err != nil {
		t.Fatalf("response %q: %v", out.String(), err)
	}
	return resp
}

func mkdirHost(t *testing.T, root, hostDir string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, hostDir), 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeHost(t *testing.T, root, hostPath, content string) {
	t.Helper()
	mkdirHost(t, root, filepath.Dir(hostPath))
	if err := os.WriteFile(filepath.Join(root, hostPath), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
