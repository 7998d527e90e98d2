package testutil

import (
	"os"

	"golang.org/x/sys/unix"

	"github.com/kairos-io/provider-kubernetes/internal/testutil/docs"
)

// DocumentedFile fails the test unless the file at the host path p is a
// regular file with the mode docs/reference.md's Files table gives it,
// root:root as the page says every one is: the promise is read from the
// page, not from the code's constant.
func (n *Node) DocumentedFile(p string) {
	n.t.Helper()
	want, err := docs.FileMode(p)
	if err != nil {
		n.t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(n.Path(p), &st); err != nil {
		n.t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || os.FileMode(st.Mode&0o7777) != want || st.Uid != 0 || st.Gid != 0 {
		n.t.Fatalf("%s: mode %04o uid %d gid %d; docs/reference.md says a %04o root:root file", p, st.Mode&0o7777, st.Uid, st.Gid, want)
	}
}
