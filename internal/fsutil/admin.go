package fsutil

import (
	"bufio"
	"bytes"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Files AdminGroups reads, and how much of each.
const (
	groupFile   = "/etc/group"
	sudoersFile = "/etc/sudoers"
	maxAccounts = 256 << 10
)

// sudoAll is a sudoers line that lets a group run every command as any
// user: "%admin ALL=(ALL) NOPASSWD: ALL", "%sudo ALL=(ALL:ALL) ALL".
var sudoAll = regexp.MustCompile(`^%([A-Za-z_][A-Za-z0-9_.-]*)\s+ALL\s*=\s*\(\s*ALL\s*(?::\s*ALL\s*)?\)\s*(?:NOPASSWD:\s*)?ALL$`)

// AdminGroups are the groups whose members are root already on the node
// under root: every group a line of root's /etc/sudoers lets run any
// command as any user (%NAME ALL=(ALL) [NOPASSWD:] ALL), by its
// gid in /etc/group. Kairos makes /oem and /usr/local/cloud-config
// root:admin 0770 at every boot and gives %admin "ALL=(ALL) NOPASSWD: ALL"
// in the same stage (kairos-init's 10_accounting.yaml): a directory only
// such a group may write is as safe to read from and write in as one only
// root may, since whoever could swap a file there can become root anyway.
// Both files are read as trusted records (root's own, written by nobody
// else, bounded, no link followed); one that cannot be read that way adds
// no group: on doubt, no group is trusted.
func AdminGroups(root string) []uint32 {
	var out []uint32
	sudoers, err := ReadFileTrusted(root, sudoersFile, maxAccounts)
	if err != nil {
		return out
	}
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(sudoers))
	sc.Buffer(make([]byte, 0, 4096), maxAccounts)
	for sc.Scan() {
		if m := sudoAll.FindStringSubmatch(strings.TrimSpace(sc.Text())); m != nil {
			names = append(names, m[1])
		}
	}
	if len(names) == 0 {
		return out
	}
	groups, err := ReadFileTrusted(root, groupFile, maxAccounts)
	if err != nil {
		return out
	}
	sc = bufio.NewScanner(bytes.NewReader(groups))
	sc.Buffer(make([]byte, 0, 4096), maxAccounts)
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 3 || !slices.Contains(names, f[0]) {
			continue
		}
		if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil && !slices.Contains(out, uint32(gid)) {
			out = append(out, uint32(gid))
		}
	}
	return out
}

// TrustedStat says whether what st describes is root's own (the
// provider's user) and writable by nobody else, or, for a directory,
// writable only by root and by its group where that group is one of
// groups (AdminGroups). World write is never trusted, nor group write on
// anything but a directory.
func TrustedStat(st *unix.Stat_t, groups []uint32) bool {
	if int(st.Uid) != os.Geteuid() || st.Mode&0o002 != 0 {
		return false
	}
	if st.Mode&0o020 == 0 {
		return true
	}
	return st.Mode&unix.S_IFMT == unix.S_IFDIR && slices.Contains(groups, st.Gid)
}
