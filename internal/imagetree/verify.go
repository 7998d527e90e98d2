package imagetree

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kairos-io/provider-kubernetes/internal/runner"
	"github.com/kairos-io/provider-kubernetes/system"
)

// SystemdAnalyze is Debian's systemd-analyze.
const SystemdAnalyze = "/usr/bin/systemd-analyze"

// VerifyUnits runs `systemd-analyze verify --root` on the tree's units as
// they will be on a node: the tree laid over a base system's units (the
// build host's /usr/lib/systemd/system, standing in for the Kairos base
// image's systemd), with the tree's own binaries, so ExecStart= paths,
// drop-ins and .wants links are checked for real. Any output, even a
// warning, is a failure.
func VerifyUnits(ctx context.Context, tree, baseUnits string) error {
	if baseUnits == "" {
		baseUnits = system.UnitDir
	}
	vroot, err := os.MkdirTemp(filepath.Dir(tree), ".verify-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(vroot)
	if err := linkTree(tree, vroot); err != nil {
		return err
	}
	// The base's units under the tree's: the tree wins on a name clash.
	if err := addMissing(baseUnits, filepath.Join(vroot, system.UnitDir)); err != nil {
		return err
	}
	units := []string{"multi-user.target"}
	for _, u := range system.Units() {
		rel := strings.TrimPrefix(u.Path, system.UnitDir+"/")
		if !strings.Contains(rel, "/") {
			units = append(units, rel)
		}
	}
	res, err := runner.Exec{}.Run(ctx, runner.Cmd{Path: SystemdAnalyze,
		Args: append([]string{"verify", "--root=" + vroot, "--man=no"}, units...), Timeout: 2 * time.Minute})
	out := strings.TrimSpace(string(res.Stdout) + string(res.Stderr))
	if err != nil || out != "" {
		return fmt.Errorf("systemd-analyze verify %v: %v: %s", units, err, runner.Sanitize(strings.ReplaceAll(out, vroot, "TREE"), 2000))
	}
	return nil
}

// linkTree recreates src's directories and symlinks in dst and hard-links
// its files (copies them across filesystems).
func linkTree(src, dst string) error { return layTree(src, dst, false) }

// addMissing lays base's entries (files, symlinks, .wants/.d directories)
// into dst where dst has none of that name.
func addMissing(base, dst string) error { return layTree(base, dst, true) }

// layTree walks src once: directories are created, symlinks recreated,
// regular files hard-linked or, across filesystems, copied with their mode.
// With keep, an entry dst already has is left as it is.
func layTree(src, dst string, keep bool) error {
	return filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		t := filepath.Join(dst, rel)
		if keep {
			if _, err := os.Lstat(t); err == nil {
				return nil
			}
		}
		switch {
		case fi.IsDir():
			return os.MkdirAll(t, 0o755)
		case fi.Mode()&os.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(l, t)
		case fi.Mode().IsRegular():
			if err := os.Link(p, t); err == nil {
				return nil
			}
			_, err := copyFile(p, t, fi.Mode().Perm())
			return err
		}
		return nil
	})
}
