package testutil

import (
	"math"
	"testing"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		v    []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{7}, 7}} {
		if got := Median(tc.v); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.v, got, tc.want)
		}
	}
	if !math.IsNaN(Median(nil)) {
		t.Error("the median of nothing is a number")
	}
	if got := MinMedianMax([]float64{3, 1, 2}, "%.1f"); got != "1.0 / 2.0 / 3.0" {
		t.Errorf("MinMedianMax = %q", got)
	}
}
