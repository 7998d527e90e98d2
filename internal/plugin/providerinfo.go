package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	sdkbus "github.com/kairos-io/kairos-sdk/bus"
	pluggable "github.com/mudler/go-pluggable"

	"github.com/kairos-io/provider-kubernetes/internal/bundle"
	"github.com/kairos-io/provider-kubernetes/internal/fsutil"
	"github.com/kairos-io/provider-kubernetes/internal/paths"
)

// ProviderName is what init.provider.info answers as the provider: kairos-init
// writes it to /etc/kairos-release as KAIROS_SOFTWARE_VERSION_PREFIX.
const ProviderName = "k8s"

// MaxBundleSize bounds the bundle manifest read (as the reconcile pass does).
const MaxBundleSize = 1 << 20

// onInfo answers kairos-init's init.provider.info: the response's data is
// kairos-sdk's bus.ProviderInstalledVersionPayload as JSON,
// {"provider":"k8s","version":"vX.Y.Z"}, the version being the bundled
// kubeadm's from the image's bundle manifest; kairos-init writes them to
// /etc/kairos-release as KAIROS_SOFTWARE_VERSION_PREFIX and
// KAIROS_SOFTWARE_VERSION. The event's data (kairos-init sends null) is not
// read. Without a manifest that names an exact kubeadm release the answer
// is an error and no version: kairos-init then writes neither key rather
// than a guessed one.
func (o *Options) onInfo(_ *pluggable.Event) pluggable.EventResponse {
	b, err := o.readBundle()
	switch {
	case errors.Is(err, os.ErrNotExist):
		return failInfo("init.provider.info: no bundle manifest at %s (or a directory above it is missing): the image does not say which kubeadm it bundles, so no version is reported", paths.BundleManifest)
	case errors.Is(err, fsutil.ErrSymlink):
		return failInfo("init.provider.info: %s: a symlink (the manifest or a directory above it) is not followed: no version is reported", paths.BundleManifest)
	case err != nil:
		return failInfo("init.provider.info: cannot read the bundle manifest: %v: no version is reported", err)
	}
	m, err := bundle.Parse(b)
	if err != nil {
		// bundle.Parse's error quotes the manifest's values: not repeated.
		return failInfo("init.provider.info: %s is not a valid bundle manifest (YAML with only the manifest's keys, kubeadm an exact release vMAJOR.MINOR.PATCH, kubelet, when set, the same release): no version is reported", paths.BundleManifest)
	}
	data, err := json.Marshal(sdkbus.ProviderInstalledVersionPayload{Provider: ProviderName, Version: m.KubeadmVersion().String()})
	if err != nil {
		return failInfo("init.provider.info: %v", err)
	}
	fmt.Printf("provider-kubernetes: provider %s, bundled kubeadm %s (%s)\n", ProviderName, m.KubeadmVersion(), paths.BundleManifest)
	return pluggable.EventResponse{State: sdkbus.EventResponseSuccess, Data: string(data)}
}

// readBundle reads the bundle manifest under the root without following a
// symlink in any component, only a regular file, never blocking, at most
// MaxBundleSize bytes.
func (o *Options) readBundle() ([]byte, error) {
	return fsutil.ReadFileBeneath(o.Root.Path("/"), paths.BundleManifest, MaxBundleSize)
}

func failInfo(format string, a ...any) pluggable.EventResponse {
	r := fail(format, a...)
	r.State = sdkbus.EventResponseError
	return r
}
