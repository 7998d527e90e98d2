package etcdsnap

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/kairos-io/provider-kubernetes/internal/testutil/etcdtest"
)

func TestParseManifest(t *testing.T) {
	got, err := ParseManifest([]byte(etcdtest.Manifest("cp1", "registry.k8s.io/etcd:3.6.8-0", 2379, 2380)))
	if err != nil {
		t.Fatal(err)
	}
	want := Endpoint{URL: "https://127.0.0.1:2379", CA: "/etc/kubernetes/pki/etcd/ca.crt",
		Cert: "/etc/kubernetes/pki/etcd/healthcheck-client.crt", Key: "/etc/kubernetes/pki/etcd/healthcheck-client.key", DataDir: "/var/lib/etcd"}
	if got != want {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	pod := func(flags ...string) []byte {
		return []byte("spec:\n  containers:\n  - name: etcd\n    command:\n    - etcd\n" + func() string {
			var b strings.Builder
			for _, f := range flags {
				b.WriteString("    - " + f + "\n")
			}
			return b.String()
		}())
	}
	ca := "--trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt"
	cases := []struct {
		name string
		in   []byte
		url  string // "" = error
		data string
	}{
		{"kubeadm: loopback first among listen URLs", pod(ca, "--listen-client-urls=https://10.0.0.11:2379,https://127.0.0.1:2379", "--advertise-client-urls=https://10.0.0.11:2379"), "https://127.0.0.1:2379", "/var/lib/etcd"},
		{"IPv6 loopback", pod(ca, "--listen-client-urls=https://[::1]:2379,https://[fd00::11]:2379"), "https://[::1]:2379", "/var/lib/etcd"},
		{"no loopback: the advertised URL", pod(ca, "--listen-client-urls=https://10.0.0.11:2379", "--advertise-client-urls=https://10.0.0.11:2379"), "https://10.0.0.11:2379", "/var/lib/etcd"},
		{"custom data dir", pod(ca, "--listen-client-urls=https://127.0.0.1:2379", "--data-dir=/data/etcd"), "https://127.0.0.1:2379", "/data/etcd"},
		{"plain http is refused", pod(ca, "--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://10.0.0.11:2379"), "", ""},
		{"no CA", pod("--listen-client-urls=https://127.0.0.1:2379"), "", ""},
		{"relative CA", pod("--trusted-ca-file=pki/ca.crt", "--listen-client-urls=https://127.0.0.1:2379"), "", ""},
		{"no etcd container", []byte("spec:\n  containers:\n  - name: other\n"), "", ""},
		{"not yaml", []byte("\t:::"), "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ep, err := ParseManifest(c.in)
			if c.url == "" {
				if err == nil || !errors.Is(err, ErrManifest) {
					t.Fatalf("want ErrManifest, got %+v %v", ep, err)
				}
				return
			}
			if err != nil || ep.URL != c.url || ep.DataDir != c.data || ep.Cert != "/etc/kubernetes/pki/etcd/healthcheck-client.crt" {
				t.Fatalf("%+v %v", ep, err)
			}
		})
	}
}

func TestLagging(t *testing.T) {
	cases := []struct {
		target  string
		members []Member
		want    []string
	}{
		{"3.7.0-0", []Member{{"cp1", "3.6.8"}, {"cp2", "3.6.11"}, {"cp3", "3.6.10"}}, []string{"cp1=3.6.8", "cp3=3.6.10"}},
		{"3.7.0-0", []Member{{"cp1", "3.6.11"}, {"cp2", "3.6.16"}}, nil},
		{"3.7.0-0", []Member{{"cp1", "3.7.0"}, {"cp2", "3.6.8"}}, []string{"cp2=3.6.8"}}, // mid-upgrade
		{"3.7.0-0", []Member{{"cp1", ""}, {"", "3.5.21"}}, []string{"(unnamed)=3.5.21", "cp1=unknown"}},
		{"3.7.0-0", []Member{{"cp1", "4.0.0"}}, nil},
		{"3.6.8-0", []Member{{"cp1", "3.6.6"}}, nil}, // no rule for 3.6
		{"garbage", []Member{{"cp1", "3.6.6"}}, nil},
	}
	for _, c := range cases {
		if got := Lagging(c.target, c.members); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Lagging(%s, %v) = %q, want %q", c.target, c.members, got, c.want)
		}
	}
	msg := VersionWarning("v1.37.2", "3.7.0-0", []string{"cp1=3.6.8"})
	for _, s := range []string{"below 3.6.11", "v1.37.2", "etcd 3.7.0", "cp1=3.6.8", "warning"} {
		if !strings.Contains(msg, s) {
			t.Errorf("message %q lacks %q", msg, s)
		}
	}
}

func TestParseStatus(t *testing.T) {
	const size = 1<<20 + 32
	for _, tc := range []struct {
		name, out string
		want      snapshotStatus
		err       string
	}{
		{"etcdutl 3.7", `{"hash":3735928559,"revision":42,"totalKey":17,"totalSize":1048576,"version":"3.6.0"}` + "\n",
			snapshotStatus{Hash: 3735928559, Revision: 42, Keys: 17}, ""},
		{"empty keyspace", `{"hash":1,"revision":0,"totalKey":0,"totalSize":20480,"version":""}`, snapshotStatus{Hash: 1}, ""},
		{"no output", "", snapshotStatus{}, "unreadable output"},
		{"a table, not json", "+------+\n| HASH |\n", snapshotStatus{}, "unreadable output"},
		{"two statuses", `{"hash":1,"revision":1,"totalKey":1,"totalSize":1}{"hash":1,"revision":1,"totalKey":1,"totalSize":1}`, snapshotStatus{}, "more than one"},
		{"no hash", `{"revision":1,"totalKey":1,"totalSize":1}`, snapshotStatus{}, "missing"},
		{"no key count", `{"hash":1,"revision":1,"totalSize":1}`, snapshotStatus{}, "missing"},
		{"negative revision", `{"hash":1,"revision":-1,"totalKey":0,"totalSize":1}`, snapshotStatus{}, "revision -1"},
		{"keys without a revision", `{"hash":1,"revision":0,"totalKey":3,"totalSize":1}`, snapshotStatus{}, "revision 0 with 3 keys"},
		{"database larger than the file", `{"hash":1,"revision":1,"totalKey":1,"totalSize":2097152}`, snapshotStatus{}, "in a 1048608-byte file"},
		{"empty database", `{"hash":1,"revision":1,"totalKey":1,"totalSize":0}`, snapshotStatus{}, "database of 0 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatus([]byte(tc.out), size)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v %v, want %+v", got, err, tc.want)
			}
		})
	}
}
