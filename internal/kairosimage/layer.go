package kairosimage

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// LayerTime is every entry's modification time in a layer this package
// writes: a layer's bytes then depend on the files' content, modes, owners
// and extended attributes only, so an unchanged tree gives the same digest
// (and a cached installed disk stays valid) whenever it is rebuilt.
var LayerTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// WriteLayer writes the tree at root as a gzip-compressed tar at out
// (through out.part, fsynced, renamed): entries in lexical order, numeric
// owners, LayerTime, no access or change times, extended attributes kept
// (file capabilities), hard links as links. Paths for which skip returns
// true (slash-separated, relative to root, no leading "./") are left out
// with everything under them; a socket is left out (tar has no type for
// it). It returns the number of entries written.
func WriteLayer(root, out string, skip func(rel string) bool) (int, error) {
	part := out + ".part"
	f, err := os.OpenFile(part, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return 0, err
	}
	n, werr := writeLayer(f, root, skip)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		os.Remove(part)
		return 0, fmt.Errorf("layer of %s: %w", root, werr)
	}
	if err := os.Rename(part, out); err != nil {
		return 0, err
	}
	return n, syncDir(filepath.Dir(out))
}

func writeLayer(w io.Writer, root string, skip func(string) bool) (int, error) {
	bw := bufio.NewWriterSize(w, 1<<20)
	// BestSpeed: the base layer is ~1.7 GB unpacked; default compression
	// costs minutes of one core for ~10% less to pull over loopback.
	zw, err := gzip.NewWriterLevel(bw, gzip.BestSpeed)
	if err != nil {
		return 0, err
	}
	tw := tar.NewWriter(zw)
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	n := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		if skip != nil && skip(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSocket != 0 {
			return nil
		}
		target := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat", rel)
		}
		h.Name = rel
		if fi.IsDir() {
			h.Name += "/"
		}
		h.Uid, h.Gid = int(st.Uid), int(st.Gid)
		h.Uname, h.Gname = "", ""
		h.ModTime, h.AccessTime, h.ChangeTime = LayerTime, time.Time{}, time.Time{}
		h.Format = tar.FormatPAX
		if fi.Mode().IsRegular() && st.Nlink > 1 {
			k := inode{uint64(st.Dev), st.Ino}
			if first, seen := links[k]; seen {
				h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
			} else {
				links[k] = rel
			}
		}
		x, err := xattrs(p)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		if len(x) > 0 {
			h.PAXRecords = map[string]string{}
			for k, v := range x {
				h.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		n++
		if h.Typeflag == tar.TypeReg {
			f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
			if err != nil {
				return err
			}
			c, err := io.CopyN(tw, f, h.Size)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w (copied %d of %d bytes)", rel, err, c, h.Size)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if err := tw.Close(); err != nil {
		return 0, err
	}
	if err := zw.Close(); err != nil {
		return 0, err
	}
	return n, bw.Flush()
}

// xattrs reads a path's extended attributes without following a link,
// sorted by name when written (tar sorts PAX records).
func xattrs(p string) (map[string]string, error) {
	buf := make([]byte, 4096)
	sz, err := unix.Llistxattr(p, buf)
	if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list extended attributes: %w", err)
	}
	var names []string
	for _, n := range strings.Split(string(buf[:sz]), "\x00") {
		if n != "" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	out := map[string]string{}
	val := make([]byte, 64<<10)
	for _, n := range names {
		vs, err := unix.Lgetxattr(p, n, val)
		if err != nil {
			return nil, fmt.Errorf("extended attribute %q: %w", n, err)
		}
		out[n] = string(val[:vs])
	}
	return out, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
