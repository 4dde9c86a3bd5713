package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/laneway-dev/laneway/internal/testbed/modelsim"
	"github.com/laneway-dev/laneway/pkg/extproc"
)

// cluster is one environment's plumbing. The scenarios use nothing else,
// so both environments run the same scenarios and judge them alike.
type cluster interface {
	// install installs the chart as a release of its own in a fresh
	// namespace (an InferencePool selecting the spec's pods, the spec's
	// policy values), runs the pods, and returns once the picker is ready
	// and sees every Ready pod. Everything is removed at the test's
	// cleanup.
	install(t *testing.T, spec installSpec) *release
}

// installSpec is one scenario's release.
type installSpec struct {
	// name names the namespace (e2e-<name>) and the release.
	name string
	// values is chart values YAML (policy classes and profile).
	values string
	// pods are the pool's model-server pods.
	pods []podSpec
}

// podSpec is one model-server pod.
type podSpec struct {
	name string
	// notReady keeps the pod out of the pool's endpoints: its Ready
	// condition stays False.
	notReady bool
}

// simArgs are the model servers' flags: the SPEC §11 server (4 sequences,
// 8192-token steps, no prefix caching), as internal/testbed/demo runs it.
var simArgs = []string{
	"--max-num-seqs=4", "--max-num-batched-tokens=8192", "--enable-prefix-caching=false",
	"--prefill-tokens-per-sec=40000", "--time-per-output-token=10ms",
}

// release is one installed chart with its pods, as the scenarios see it.
type release struct {
	t    *testing.T
	ns   string
	pool string
	// url is the gateway's base URL (the local gateway, or a port-forward
	// to the chart's Envoy).
	url string
	// kube is an administrator's client for the release's namespace.
	kube client.Client
	// pods by name; addr is the endpoint the picker routes to.
	pods map[string]*simPod
	ops  releaseOps
	http *http.Client
}

// simPod is one model-server pod of a release.
type simPod struct {
	name string
	// addr is ip:port, the endpoint address the picker names.
	addr string
}

// releaseOps are the environment-specific operations on a release.
type releaseOps interface {
	// beginPodDeletion deletes the pod gracefully: it keeps running and
	// serving while it terminates (the picker taints its endpoint).
	beginPodDeletion(ctx context.Context, pod string) error
	// finishPodDeletion returns once the pod object is gone, the picker no
	// longer routes to it, and its server has stopped after finishing the
	// requests it had.
	finishPodDeletion(ctx context.Context, pod string) error
	// restartPicker replaces the picker the way the environment does
	// (SIGTERM and a new process; a rolling restart of the Deployment) and
	// returns once a picker is ready again.
	restartPicker(ctx context.Context) error
	// pickerMetrics returns the serving picker's /metrics page.
	pickerMetrics(ctx context.Context) ([]byte, error)
	// diagnostics is the picker's log (or where to find it), for a failed
	// test's output.
	diagnostics() string
}

// request is one client request of a scenario.
type request struct {
	class string
	// strict is the strict-priority tier header; negative: none.
	strict int
	// pin restricts the request to one endpoint (ip:port) through the
	// conformance header, which makes it a pinned (exact-lane) request.
	pin string
	// promptTokens and maxTokens size the request; 0 means 512 and 1.
	promptTokens, maxTokens int
}

// answer is what the client got.
type answer struct {
	req    request
	status int
	// reason is x-laneway-reason of an answer the picker or gateway made
	// itself; served is the modelsim instance (pod name) that answered.
	reason, served string
	body           []byte
	// err is a transport failure or a broken stream: never acceptable.
	err error
	at  time.Time
}

func (a answer) String() string {
	if a.err != nil {
		return fmt.Sprintf("%+v: transport error %v", a.req, a.err)
	}
	return fmt.Sprintf("%+v: %d %s served=%s %s", a.req, a.status, a.reason, a.served, bytes.TrimSpace(a.body))
}

// promptSeq makes every prompt of the binary distinct, so no request
// shares a prefix with another (prefix caching is off anyway).
var promptSeq atomic.Int64

func promptJSON(tokens, maxTokens int) []byte {
	base := 10_000_000 + promptSeq.Add(1)*int64(tokens)
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"model":"sim-model","max_tokens":%d,"stream":true,"prompt":[`, maxTokens)
	for i := 0; i < tokens; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(base+int64(i), 10))
	}
	b.WriteString("]}")
	return b.Bytes()
}

// send makes one request through the gateway and reads the whole answer.
func (r *release) send(ctx context.Context, q request) (a answer) {
	a.req = q
	defer func() { a.at = time.Now() }()
	tokens, maxTok := q.promptTokens, q.maxTokens
	if tokens == 0 {
		tokens = 512
	}
	if maxTok == 0 {
		maxTok = 1
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+"/v1/completions", bytes.NewReader(promptJSON(tokens, maxTok)))
	if err != nil {
		a.err = err
		return a
	}
	req.Header.Set("content-type", "application/json")
	if q.class != "" {
		req.Header.Set("x-dynamo-meta-policy-class", q.class)
	}
	if q.strict >= 0 {
		req.Header.Set("x-dynamo-request-strict-priority", strconv.Itoa(q.strict))
	}
	if q.pin != "" {
		req.Header.Set(extproc.HeaderTestEndpointSelection, q.pin)
	}
	resp, err := r.http.Do(req)
	if err != nil {
		a.err = err
		return a
	}
	defer resp.Body.Close()
	a.status = resp.StatusCode
	a.reason = resp.Header.Get(extproc.HeaderReason)
	a.served = resp.Header.Get(modelsim.InstanceHeader)
	if resp.StatusCode != http.StatusOK {
		a.body, a.err = io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return a
	}
	// A 200 is complete only with the stream's end marker.
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "data: [DONE]" {
			done = true
		}
	}
	switch {
	case sc.Err() != nil:
		a.err = fmt.Errorf("read stream: %w", sc.Err())
	case !done:
		a.err = errors.New("stream ended without data: [DONE]")
	}
	return a
}

// sendAll sends every request at once and returns the answers in
// completion order.
func (r *release) sendAll(ctx context.Context, qs []request) []answer {
	out := make(chan answer, len(qs))
	var wg sync.WaitGroup
	for _, q := range qs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out <- r.send(ctx, q)
		}()
	}
	wg.Wait()
	close(out)
	var as []answer
	for a := range out {
		as = append(as, a)
	}
	return as
}

// limitDetails is the JSON of a 429 over a queue limit (SPEC §5).
type limitDetails struct {
	Error   string `json:"error"`
	Details struct {
		PolicyClass string `json:"policy_class"`
		LimitKind   string `json:"limit_kind"`
		Current     int64  `json:"current"`
		Limit       int64  `json:"limit"`
	} `json:"details"`
}

func parseLimit(body []byte) (limitDetails, error) {
	var d limitDetails
	err := json.Unmarshal(body, &d)
	return d, err
}

// newHTTPClient is the scenarios' client: no connection cap (hundreds of
// requests are open at once) and no proxy from the environment.
func newHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		MaxIdleConnsPerHost: 1024,
		DisableCompression:  true,
	}}
}

// newCluster returns the environment E2E_ENV selects, or skips.
func newCluster(t *testing.T) cluster {
	t.Helper()
	switch e := e2eEnv(); e {
	case envLocal:
		return newLocalCluster(t)
	case envKind:
		return newKindCluster(t)
	default:
		t.Fatalf("E2E_ENV=%q: want %s or %s", e, envLocal, envKind)
		return nil
	}
}
