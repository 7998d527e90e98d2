package kube

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The bounds what-it-refuses.md gives for every read from an apiserver,
// written here as the page says them (not the package's constants): an
// answer is read up to 32 MiB (after decompression), lists in pages of
// 500, at most 10,000 objects.
const (
	documentedAnswer  = 32 << 20
	documentedPage    = 500
	documentedObjects = 10000
)

// pagedNodes serves GET /api/v1/nodes from total Nodes in the pages the
// client asks for, recording each request's limit.
type pagedNodes struct {
	total  int
	mu     sync.Mutex
	limits []string
}

func (p *pagedNodes) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/v1/nodes" {
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	p.mu.Lock()
	p.limits = append(p.limits, q.Get("limit"))
	p.mu.Unlock()
	limit, err := strconv.Atoi(q.Get("limit"))
	if err != nil || limit <= 0 {
		limit = p.total // no paging asked: all at once
	}
	from := 0
	if c := q.Get("continue"); c != "" {
		if from, err = strconv.Atoi(c); err != nil {
			http.Error(w, "bad continue", http.StatusBadRequest)
			return
		}
	}
	to := min(from+limit, p.total)
	var b strings.Builder
	b.WriteString(`{"kind":"NodeList","apiVersion":"v1","metadata":{`)
	if to < p.total {
		fmt.Fprintf(&b, `"continue":"%d"`, to)
	}
	b.WriteString(`},"items":[`)
	for i := from; i < to; i++ {
		if i > from {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"metadata":{"name":"n%05d","uid":"u%d"},"status":{"nodeInfo":{"kubeletVersion":"v1.37.2"},"conditions":[{"type":"Ready","status":"True"}]}}`, i, i)
	}
	b.WriteString(`]}`)
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(b.String()))
}

func TestListsArePagedAndBoundedAsDocumented(t *testing.T) {
	for _, tc := range []struct {
		total int
		ok    bool
	}{{documentedObjects, true}, {documentedObjects + 1, false}} {
		t.Run(strconv.Itoa(tc.total), func(t *testing.T) {
			srv := &pagedNodes{total: tc.total}
			c := clientFor(t, kubeconfigFor(tlsServer(t, srv), "", "{token: t}"), 20*time.Second)
			nodes, err := c.Nodes(context.Background())
			if tc.ok && (err != nil || len(nodes) != tc.total) {
				t.Fatalf("%d Nodes: %d listed, %v", tc.total, len(nodes), err)
			}
			if !tc.ok && (err == nil || !strings.Contains(err.Error(), "more than "+strconv.Itoa(documentedObjects))) {
				t.Fatalf("%d Nodes: %d listed, %v; want the list refused past %d", tc.total, len(nodes), err, documentedObjects)
			}
			srv.mu.Lock()
			defer srv.mu.Unlock()
			for _, l := range srv.limits {
				if l != strconv.Itoa(documentedPage) {
					t.Fatalf("a page asked with limit=%q, want %d: %q", l, documentedPage, srv.limits)
				}
			}
			// Every page followed: exactly as many requests as pages.
			if want := (min(tc.total, documentedObjects+documentedPage) + documentedPage - 1) / documentedPage; len(srv.limits) != want {
				t.Fatalf("%d requests for %d Nodes, want %d", len(srv.limits), tc.total, want)
			}
		})
	}
}

func TestAnswersAreReadUpToTheDocumentedSize(t *testing.T) {
	for _, tc := range []struct {
		size int
		ok   bool
	}{{documentedAnswer, true}, {documentedAnswer + 1, false}} {
		t.Run(strconv.Itoa(tc.size), func(t *testing.T) {
			body := []byte(nodeJSON + strings.Repeat(" ", tc.size-len(nodeJSON)))
			srv := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Write(body)
			}))
			c := clientFor(t, kubeconfigFor(srv, "", "{token: t}"), 30*time.Second)
			ni, err := c.Node(context.Background(), "n1")
			if tc.ok && (err != nil || ni.UID != "u1") {
				t.Fatalf("an answer of %d bytes: %+v %v", tc.size, ni, err)
			}
			if !tc.ok && !errors.Is(err, ErrAnswerTooLarge) && (err == nil || !strings.Contains(err.Error(), ErrAnswerTooLarge.Error())) {
				t.Fatalf("an answer of %d bytes: %v, want it refused as too large", tc.size, err)
			}
		})
	}
}
