package wait

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
	ch := make(chan time.Time, 1)
	ch <- c.now
	return ch
}

func TestPollReportsTheLastRealError(t *testing.T) {
	clk := &fakeClock{now: time.Unix(0, 0)}
	n := 0
	err := Poll(context.Background(), clk, Budget{Total: time.Minute, Interval: 2 * time.Second}, "wait for x", func(context.Context) (bool, error) {
		n++
		return false, errors.New("connection refused #" + string(rune('0'+n%10)))
	})
	if !errors.Is(err, ErrBudgetExhausted) || !strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "timed out") {
		t.Fatalf("%v", err)
	}
	if elapsed := clk.Now().Sub(time.Unix(0, 0)); elapsed != time.Minute {
		t.Fatalf("spent %s of a 1m budget", elapsed)
	}
	if n != 31 {
		t.Fatalf("%d attempts in 1m at 2s", n)
	}
}

func TestPollIntervalIsCappedAt2s(t *testing.T) {
	clk := &fakeClock{now: time.Unix(0, 0)}
	n := 0
	_ = Poll(context.Background(), clk, Budget{Total: 10 * time.Second, Interval: time.Minute}, "x", func(context.Context) (bool, error) {
		n++
		return false, nil
	})
	if n != 6 {
		t.Fatalf("%d attempts", n)
	}
}

func TestPollSucceedsLate(t *testing.T) {
	clk := &fakeClock{now: time.Unix(0, 0)}
	n := 0
	err := Poll(context.Background(), clk, Budget{Total: time.Minute, Interval: time.Second}, "x", func(context.Context) (bool, error) {
		n++
		return n == 5, nil
	})
	if err != nil || n != 5 {
		t.Fatalf("%v %d", err, n)
	}
}

func TestPollPerAttemptTimeout(t *testing.T) {
	err := Poll(context.Background(), RealClock{}, Budget{Total: 300 * time.Millisecond, Interval: 100 * time.Millisecond, PerAttempt: 50 * time.Millisecond}, "x",
		func(ctx context.Context) (bool, error) {
			<-ctx.Done() // a hung attempt
			return false, ctx.Err()
		})
	if !errors.Is(err, ErrBudgetExhausted) || !strings.Contains(err.Error(), "deadline exceeded") {
		t.Fatalf("%v", err)
	}
}

func TestPollStopsWithTheCaller(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Poll(ctx, RealClock{}, Budget{Total: time.Hour}, "x", func(context.Context) (bool, error) { return false, errors.New("nope") })
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("%v", err)
	}
}
