package epp

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestServePprof(t *testing.T) {
	addr, stop, err := ServePprof("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	cases := []struct {
		path string
		want string
	}{
		{"/debug/pprof/", "goroutine"},
		{"/debug/pprof/cmdline", ""},
		{"/debug/pprof/goroutine?debug=1", "goroutine profile"},
	}
	for _, tc := range cases {
		resp, err := http.Get("http://" + addr + tc.path)
		if err != nil {
			t.Fatalf("GET %s: %v", tc.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), tc.want) {
			t.Errorf("GET %s: %d, body without %q", tc.path, resp.StatusCode, tc.want)
		}
	}
	if _, _, err := ServePprof(addr); err == nil {
		t.Errorf("second listener on %s did not fail", addr)
	}
}
