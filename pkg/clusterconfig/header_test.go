package clusterconfig

import (
	"strings"
	"testing"
)

// Kairos's collector (kairos-sdk v0.25.3 HasValidHeader) reads a file as a
// cloud-config only with one of three headers in its first ten lines.
func TestHasCloudConfigHeader(t *testing.T) {
	nine := strings.Repeat("# comment\n", 9)
	for _, tc := range []struct {
		name, data string
		want       bool
	}{
		{"first line", "#cloud-config\ncluster: {}\n", true},
		{"kairos-config", "#kairos-config\n", true},
		{"node-config", "#node-config\n", true},
		{"trailing space and CRLF", "#cloud-config \r\n", true},
		{"tenth line", nine + "#cloud-config\n", true},
		{"eleventh line", nine + "#x\n#cloud-config\n", false},
		{"no header", "cluster: {}\n", false},
		{"words after it", "#cloud-config please\n", false},
		{"leading space", " #cloud-config\n", false},
		{"empty", "", false},
	} {
		if got := HasCloudConfigHeader([]byte(tc.data)); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
