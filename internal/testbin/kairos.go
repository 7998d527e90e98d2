package testbin

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// ImmucoreVersion and KairosInitVersion are the Kairos boot pieces the
// project's images are built with: immucore runs in the initrd and mounts
// the A/B images and the persistent bind mounts; kairos-init turns a
// Debian tree into a Kairos core image.
const (
	ImmucoreVersion   = "v0.20.4"
	KairosInitVersion = "v0.16.4"
)

// Immucore returns the path of immucore at ImmucoreVersion built from its
// module (-tags nogit,nounpack, static), cached.
func Immucore(ctx context.Context, log io.Writer) (string, error) {
	const module = "github.com/kairos-io/immucore"
	return goBinary(ctx, module, ImmucoreVersion, module, "immucore",
		"-s -w -X "+module+"/internal/version.version="+ImmucoreVersion, "nogit,nounpack", log)
}

// KairosInit returns the path of kairos-init at KairosInitVersion, cached.
// Its module zip lacks the binaries it embeds (its Makefile downloads them
// from release pages): the build copies the module source, puts the real
// kairos-agent and immucore built here in pkg/bundled/binaries, and, for
// the four a core image never installs (kcrypt-discovery-challenger,
// provider-kairos, kairos-installer, edgevpn), a script that fails saying
// it is a stand-in, so nothing can run one by mistake and succeed.
func KairosInit(ctx context.Context, log io.Writer) (string, error) {
	const module = "github.com/kairos-io/kairos-init"
	key := strings.ReplaceAll(module, "/", "_") + "@" + KairosInitVersion
	out := filepath.Join(CacheDir(), "bin", key, "kairos-init")
	agent, err := KairosAgent(ctx, log)
	if err != nil {
		return "", err
	}
	immucore, err := Immucore(ctx, log)
	if err != nil {
		return "", err
	}
	return out, cached(out, "kairos-init "+KairosInitVersion+" (with kairos-agent "+KairosAgentVersion+" and immucore "+ImmucoreVersion+" embedded)", log, func() error {
		src, err := moduleDir(ctx, module, KairosInitVersion)
		if err != nil {
			return err
		}
		dir := filepath.Join(CacheDir(), "wrap", key)
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		if err := copyTree(src, dir); err != nil {
			return err
		}
		bins := filepath.Join(dir, "pkg", "bundled", "binaries")
		for _, d := range []string{bins, filepath.Join(bins, "fips")} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		for name, from := range map[string]string{"kairos-agent": agent, "immucore": immucore} {
			b, err := os.ReadFile(from)
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(bins, name), b, 0o755); err != nil {
				return err
			}
		}
		stub := func(name string) []byte {
			return []byte("#!/bin/sh\necho '" + name + ": a stand-in built into kairos-init by provider-kubernetes tests; a core image never runs it' >&2\nexit 1\n")
		}
		for _, name := range []string{"kcrypt-discovery-challenger", "provider-kairos", "kairos-installer", "edgevpn"} {
			if err := os.WriteFile(filepath.Join(bins, name), stub(name), 0o755); err != nil {
				return err
			}
		}
		for _, name := range []string{"kairos-agent", "immucore", "kcrypt-discovery-challenger", "provider-kairos"} {
			if err := os.WriteFile(filepath.Join(bins, "fips", name), stub("fips/"+name), 0o755); err != nil {
				return err
			}
		}
		vi := fmt.Sprintf("kairos-agent: %s\nimmucore: %s\nkcrypt-discovery-challenger: stand-in\nprovider-kairos: stand-in\nedgevpn: stand-in\n", KairosAgentVersion, ImmucoreVersion)
		if err := os.WriteFile(filepath.Join(bins, "version-info.yaml"), []byte(vi), 0o644); err != nil {
			return err
		}
		return goBuild(ctx, dir, out, ".", "-s -w -X "+module+"/pkg/values.version="+KairosInitVersion, "", true, log)
	})
}

// moduleDir downloads module@ver through the module proxy and returns its
// (read-only) directory in the module cache.
func moduleDir(ctx context.Context, module, ver string) (string, error) {
	tmp, err := os.MkdirTemp("", "pk-moddl-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	gm := fmt.Sprintf("module example.com/dl\n\ngo 1.26.0\n\nrequire %s %s\n", module, ver)
	if err := os.WriteFile(filepath.Join(tmp, "go.mod"), []byte(gm), 0o644); err != nil {
		return "", err
	}
	info, err := modDownload(ctx, tmp, module, ver)
	return info.Dir, err
}

// copyTree copies the regular files and directories of src into dst,
// writable by us (the module cache is read-only); it refuses anything else.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, b, 0o644)
		default:
			return fmt.Errorf("%s: not a regular file or directory in a module", p)
		}
	})
}
