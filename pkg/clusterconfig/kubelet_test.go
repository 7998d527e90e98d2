package clusterconfig

import (
	"reflect"
	"testing"
)

// Graceful node shutdown is added only where the operator chose nothing
// about it; the operator's map is never changed.
func TestWithKubeletDefaults(t *testing.T) {
	on := map[string]any{"shutdownGracePeriod": "30s", "shutdownGracePeriodCriticalPods": "10s"}
	for _, tc := range []struct {
		name     string
		in, want map[string]any
	}{
		{"none given", nil, on},
		{"other fields kept", map[string]any{"cgroupDriver": "systemd"}, map[string]any{"cgroupDriver": "systemd", "shutdownGracePeriod": "30s", "shutdownGracePeriodCriticalPods": "10s"}},
		{"turned off", map[string]any{"shutdownGracePeriod": "0s"}, map[string]any{"shutdownGracePeriod": "0s"}},
		// 10s for critical pods would exceed a 5s whole: the kubelet refuses that.
		{"a shorter whole", map[string]any{"shutdownGracePeriod": "5s"}, map[string]any{"shutdownGracePeriod": "5s"}},
		{"critical only", map[string]any{"shutdownGracePeriodCriticalPods": "20s"}, map[string]any{"shutdownGracePeriodCriticalPods": "20s"}},
		{"by priority excludes both", map[string]any{"shutdownGracePeriodByPodPriority": []any{map[string]any{"priority": 0, "shutdownGracePeriodSeconds": 60}}},
			map[string]any{"shutdownGracePeriodByPodPriority": []any{map[string]any{"priority": 0, "shutdownGracePeriodSeconds": 60}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before map[string]any
			if tc.in != nil {
				before = map[string]any{}
				for k, v := range tc.in {
					before[k] = v
				}
			}
			got := WithKubeletDefaults(tc.in)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			if tc.in != nil && !reflect.DeepEqual(tc.in, before) {
				t.Fatalf("the operator's map changed: %v", tc.in)
			}
		})
	}
}
