package load

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/testenv"
)

// syncLog collects a subprocess's output for the failure message; exec's
// copying goroutine writes while the test may read.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.b.String()
	if len(s) > 4000 {
		s = "...\n" + s[len(s)-4000:]
	}
	return s
}

// TestSpawnLWEPP starts the upstream reference picker against its own API
// server and checks that a real ext_proc request is routed to the one
// endpoint, in header and metadata, over plaintext and TLS, with its log
// piped or written straight to a file by lwepp itself, and that Stop leaves
// neither the process nor its temp dir behind.
func TestSpawnLWEPP(t *testing.T) {
	if _, err := testenv.AssetsDir(); errors.Is(err, testenv.ErrNoAssets) {
		t.Skip(err.Error())
	}
	t.Cleanup(RemoveLWEPPBinary)
	for _, tc := range []struct {
		name    string
		tls     bool
		logFile bool
	}{
		{"plaintext, piped log", false, false},
		{"tls, log file", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			endpoint := idleEndpoint(t)
			log := &syncLog{}
			o := LWEPPOptions{TLS: tc.tls, Endpoint: endpoint, Log: log}
			if tc.logFile {
				o.LogFile = filepath.Join(t.TempDir(), "lwepp.log")
				o.Log = nil
				defer func() {
					if t.Failed() {
						b, _ := os.ReadFile(o.LogFile)
						_, _ = log.Write(b)
					}
				}()
			}
			l, err := SpawnLWEPP(context.Background(), o)
			if err != nil {
				t.Fatalf("SpawnLWEPP: %v\nlwepp log:\n%s", err, log.tail())
			}
			stopped := false
			stop := func() error {
				stopped = true
				return l.Stop(30 * time.Second)
			}
			t.Cleanup(func() {
				if !stopped {
					_ = stop()
				}
			})

			creds := insecure.NewCredentials()
			if tc.tls {
				creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // lwepp serves a self-signed certificate
			}
			conn, err := grpc.NewClient(l.GRPCAddr, grpc.WithTransportCredentials(creds))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			c := extprocclient.New(conn, extprocclient.Options{})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ex, err := c.Start(ctx, specFor(&Config{PromptTokens: 32}))
			if err != nil {
				t.Fatalf("ext_proc request: %v\nlwepp log:\n%s", err, log.tail())
			}
			d := ex.Decision()
			if !d.Routed() {
				t.Fatalf("answered directly with %+v, want a pick", d.Immediate)
			}
			want := []string{endpoint}
			if !slices.Equal(d.Endpoints, want) || !slices.Equal(d.MetadataEndpoints, want) {
				t.Errorf("picked header %v, metadata %v; want %v in both", d.Endpoints, d.MetadataEndpoints, want)
			}
			if _, _, err := ex.Respond(http.StatusOK, responseHeaders, responseChunk); err != nil {
				t.Errorf("response phase: %v", err)
			}
			if err := ex.Close(); err != nil {
				t.Errorf("close stream: %v", err)
			}
			if cpu, err := l.CPU()(); err != nil || cpu < 0 {
				t.Errorf("lwepp CPU = %v, %v; want a sample", cpu, err)
			}
			// The pid measured must be lwepp's, also when a shell set up
			// its log file and exec'd it.
			if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", l.Cmd.Process.Pid)); err != nil || strings.TrimSpace(string(comm)) != "lwepp" {
				t.Errorf("process %d is %q (%v), want lwepp", l.Cmd.Process.Pid, comm, err)
			}

			kubeconfig := l.Kubeconfig
			if err := stop(); err != nil {
				t.Fatalf("Stop: %v\nlwepp log:\n%s", err, log.tail())
			}
			if l.Cmd.ProcessState == nil || !l.Cmd.ProcessState.Exited() {
				t.Errorf("lwepp state after Stop: %v, want exited", l.Cmd.ProcessState)
			}
			if _, err := os.Stat(kubeconfig); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("kubeconfig %s after Stop: %v, want it removed", kubeconfig, err)
			}
			if tc.logFile {
				if fi, err := os.Stat(o.LogFile); err != nil || fi.Size() == 0 {
					t.Errorf("lwepp log file %s: %v, want lwepp's output in it", o.LogFile, err)
				}
			}
		})
	}
}
