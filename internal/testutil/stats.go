package testutil

import (
	"fmt"
	"math"
	"slices"
)

// Median is the median of v (the mean of the middle two for an even
// count; NaN for none): what the benchmarks report.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// MinMedianMax formats v as "min / median / max", each with format.
func MinMedianMax(v []float64, format string) string {
	if len(v) == 0 {
		return "-"
	}
	return fmt.Sprintf(format+" / "+format+" / "+format, slices.Min(v), Median(v), slices.Max(v))
}
