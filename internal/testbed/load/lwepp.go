package load

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/laneway-dev/laneway/internal/testbed/extprocclient"
	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/testenv"
)

// LWEPPPackage is the upstream lightweight reference picker (round robin,
// no queueing) that SPEC §13 measures Laneway against. It is built from the
// version of sigs.k8s.io/gateway-api-inference-extension in go.mod.
const LWEPPPackage = "sigs.k8s.io/gateway-api-inference-extension/cmd/lwepp"

// LWEPPHealthService is the gRPC health service lwepp's health port serves:
// SERVING once its InferencePool is in its datastore (it registers no
// "readiness" service, and none on the ext_proc port unless
// --health-checking).
const LWEPPHealthService = "inference-extension"

// The objects SpawnLWEPP creates in its own API server.
const (
	lweppNamespace = "lwepp-load"
	lweppPool      = "lwepp"
	lweppPod       = "idle-0"
	lweppAppLabel  = "lwepp-load"
)

// Bounds of SpawnLWEPP's waits: failure guards, not performance targets.
// The API server start has its own bound in internal/testbed/testenv.
const (
	lweppReadyTimeout = time.Minute
	lweppRouteTimeout = time.Minute
	lweppProbeTimeout = 5 * time.Second
)

// LWEPPOptions describe an upstream reference picker subprocess.
type LWEPPOptions struct {
	// Bin is the lwepp binary; empty builds LWEPPPackage once per process
	// (see RemoveLWEPPBinary).
	Bin string
	// TLS keeps lwepp's --secure-serving (self-signed, ALPN h2); otherwise
	// plaintext.
	TLS bool
	// Endpoint is the "ip:port" of the one ready endpoint lwepp must route
	// to: its pod's status.podIP and its pool's target port.
	Endpoint string
	// Args are further lwepp flags (e.g. --zap-log-level=info); lwepp's own
	// defaults apply otherwise, including --zap-devel debug logging.
	Args []string
	// Log receives lwepp's output; nil discards it (the head is kept for
	// error messages either way). Ignored when LogFile is set.
	Log io.Writer
	// LogFile, when set, is a file lwepp's output is appended to directly
	// (through /bin/sh's redirection before it execs lwepp, so the pid is
	// lwepp's). Its default logging writes several lines per request; with
	// Log they would pass through a pipe this process copies, spending the
	// load tool's CPU on the picker's logs during a measurement.
	LogFile string
}

// LWEPP is a running lwepp with the API server it reads. It is used like
// a launch.EPP: GRPCAddr is its ext_proc address, CPU samples its /proc
// times, and Stop ends it and its API server. HealthAddr serves
// LWEPPHealthService (plaintext, whatever TLS says); MetricsAddr is its
// Prometheus page.
type LWEPP struct {
	*launch.Proc
	// GRPCAddr, HealthAddr and MetricsAddr are its ext_proc, gRPC health
	// and Prometheus addresses.
	GRPCAddr, HealthAddr, MetricsAddr string
	// Endpoint is the endpoint lwepp routes to (LWEPPOptions.Endpoint).
	Endpoint string
	// Kubeconfig is the admin kubeconfig lwepp reads its API server with;
	// it is removed at Stop.
	Kubeconfig string

	stopEnv func() error
	dir     string
}

// lweppBuild caches the lwepp binary for the process: building it takes
// seconds and every SpawnLWEPP of a run uses the same one.
var lweppBuild struct {
	mu       sync.Mutex
	dir, bin string
}

// LWEPPBinary returns the lwepp binary of this process, building
// LWEPPPackage into a temporary directory on first use. The working
// directory must be inside this module (its go.mod pins the version).
func LWEPPBinary() (string, error) {
	lweppBuild.mu.Lock()
	defer lweppBuild.mu.Unlock()
	if lweppBuild.bin != "" {
		return lweppBuild.bin, nil
	}
	dir, err := os.MkdirTemp("", "lwepp-bin-")
	if err != nil {
		return "", fmt.Errorf("temp dir for %s: %w", LWEPPPackage, err)
	}
	bin, err := launch.BuildPackage(dir, LWEPPPackage, false)
	if err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	lweppBuild.dir, lweppBuild.bin = dir, bin
	return bin, nil
}

// RemoveLWEPPBinary removes the binary LWEPPBinary built (if any); the
// next call builds it again. Call it when the process is done spawning.
func RemoveLWEPPBinary() {
	lweppBuild.mu.Lock()
	defer lweppBuild.mu.Unlock()
	if lweppBuild.dir != "" {
		os.RemoveAll(lweppBuild.dir)
	}
	lweppBuild.dir, lweppBuild.bin = "", ""
}

// SpawnLWEPP starts a kube-apiserver and etcd (internal/testbed/testenv, with the
// InferencePool CRD), creates an InferencePool selecting one Pod whose
// status is Running and Ready at o.Endpoint's IP, with o.Endpoint's port
// as the pool's target port, and starts lwepp on free 127.0.0.1 ports
// against it. It returns once lwepp's health service is SERVING and a real
// ext_proc request was routed to o.Endpoint: lwepp reports healthy as soon
// as it has the pool, which can be before it has the pod. When the
// envtest binaries are missing the error wraps testenv.ErrNoAssets.
func SpawnLWEPP(ctx context.Context, o LWEPPOptions) (l *LWEPP, err error) {
	host, portStr, err := net.SplitHostPort(o.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("lwepp endpoint %q: %w", o.Endpoint, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return nil, fmt.Errorf("lwepp endpoint %q: port is not 1..65535", o.Endpoint)
	}
	if net.ParseIP(host) == nil {
		return nil, fmt.Errorf("lwepp endpoint %q: host is not an IP (it becomes a pod IP)", o.Endpoint)
	}
	if _, err := testenv.AssetsDir(); err != nil {
		return nil, err
	}

	// The build and the API server start take seconds each; overlap them.
	type built struct {
		bin string
		err error
	}
	binCh := make(chan built, 1)
	go func() {
		if o.Bin != "" {
			binCh <- built{bin: o.Bin}
			return
		}
		bin, err := LWEPPBinary()
		binCh <- built{bin, err}
	}()
	var bin built
	binReady := false
	waitBin := func() (string, error) {
		if !binReady {
			bin, binReady = <-binCh, true
		}
		return bin.bin, bin.err
	}

	l = &LWEPP{Endpoint: o.Endpoint}
	defer func() {
		if err != nil {
			// Let a build still running finish rather than outlive the call.
			if _, berr := waitBin(); berr != nil && !errors.Is(err, berr) {
				err = errors.Join(err, berr)
			}
			l.cleanup(nil)
			l = nil
		}
	}()
	if l.dir, err = os.MkdirTemp("", "lwepp-"); err != nil {
		return l, fmt.Errorf("temp dir for lwepp: %w", err)
	}
	cfg, stop, err := testenv.Start()
	if err != nil {
		return l, err
	}
	l.stopEnv = stop
	if err := createLWEPPObjects(ctx, cfg, host, port); err != nil {
		return l, err
	}
	l.Kubeconfig = filepath.Join(l.dir, "kubeconfig")
	if err := writeAdminKubeconfig(cfg, l.Kubeconfig); err != nil {
		return l, err
	}
	binPath, err := waitBin()
	if err != nil {
		return l, err
	}

	// lwepp logs no line naming the ports it bound, so they are probed
	// here.
	ports, err := launch.FreePorts("127.0.0.1", 3)
	if err != nil {
		return l, err
	}
	// lwepp has no bind-address flag: it listens on every interface of
	// these ports; the load tool only connects through 127.0.0.1.
	args := append([]string{
		"--kubeconfig=" + l.Kubeconfig,
		"--pool-namespace=" + lweppNamespace,
		"--pool-name=" + lweppPool,
		"--grpc-port=" + strconv.Itoa(ports[0]),
		"--grpc-health-port=" + strconv.Itoa(ports[1]),
		"--metrics-port=" + strconv.Itoa(ports[2]),
		"--secure-serving=" + strconv.FormatBool(o.TLS),
	}, o.Args...)
	po := launch.Options{Name: "lwepp", Bin: binPath, Args: args, LogLimit: launch.DefaultLogLimit, Output: o.Log}
	if o.LogFile != "" {
		po.Name = "lwepp (log in " + o.LogFile + ")"
		po.Bin, po.Output = "/bin/sh", nil
		po.Args = append([]string{"-c", `exec "$@" >>"$0" 2>&1`, o.LogFile, binPath}, args...)
	}
	if l.Proc, err = launch.Start(po); err != nil {
		return l, err
	}
	l.GRPCAddr = launch.HostPort("127.0.0.1", ports[0])
	l.HealthAddr = launch.HostPort("127.0.0.1", ports[1])
	l.MetricsAddr = launch.HostPort("127.0.0.1", ports[2])
	if err := launch.WaitGRPCServing(ctx, l.Proc, l.HealthAddr, LWEPPHealthService, nil, lweppReadyTimeout); err != nil {
		return l, err
	}
	if err := waitLWEPPRoutes(ctx, l, o.TLS); err != nil {
		return l, err
	}
	return l, nil
}

// CPU samples lwepp's CPU time from /proc.
func (l *LWEPP) CPU() CPUSampler { return ProcCPU(l.Cmd.Process.Pid) }

// Stop sends lwepp SIGTERM and waits up to timeout for its exit (then ends
// it as launch.Proc.Stop does), stops the API server and etcd, and removes
// the kubeconfig's directory.
func (l *LWEPP) Stop(timeout time.Duration) error {
	return l.cleanup(&timeout)
}

// cleanup undoes what SpawnLWEPP did so far; a nil timeout kills lwepp.
func (l *LWEPP) cleanup(timeout *time.Duration) error {
	var errs []error
	if l.Proc != nil {
		if timeout == nil {
			l.Proc.Kill()
		} else if err := l.Proc.Stop(*timeout); err != nil {
			errs = append(errs, err)
		}
	}
	if l.stopEnv != nil {
		if err := l.stopEnv(); err != nil {
			errs = append(errs, fmt.Errorf("stop lwepp's API server: %w", err))
		}
		l.stopEnv = nil
	}
	if l.dir != "" {
		if err := os.RemoveAll(l.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove lwepp temp dir: %w", err))
		}
		l.dir = ""
	}
	return errors.Join(errs...)
}

// createLWEPPObjects creates the namespace, the InferencePool and its one
// Pod, writing the Pod's status as a kubelet would: lwepp counts a pod as
// an endpoint when it matches the pool's selector, has the Ready condition
// True and no deletion timestamp; its address is status.podIP and its port
// each of the pool's target ports.
func createLWEPPObjects(ctx context.Context, cfg *rest.Config, ip string, port int) error {
	scheme, err := testenv.Scheme()
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("client for lwepp's API server: %w", err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lweppNamespace}}
	if err := c.Create(ctx, ns); err != nil {
		return fmt.Errorf("create namespace %s: %w", lweppNamespace, err)
	}
	pool := &inferencev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: lweppNamespace, Name: lweppPool}}
	pool.Spec.Selector.MatchLabels = map[inferencev1.LabelKey]inferencev1.LabelValue{"app": lweppAppLabel}
	pool.Spec.TargetPorts = []inferencev1.Port{{Number: inferencev1.PortNumber(port)}}
	// Required by the CRD; lwepp never reads it (no Service exists).
	pool.Spec.EndpointPickerRef = &inferencev1.EndpointPickerRef{Name: "lwepp", Port: &inferencev1.Port{Number: 9002}}
	if err := c.Create(ctx, pool); err != nil {
		return fmt.Errorf("create InferencePool %s/%s: %w", lweppNamespace, lweppPool, err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: lweppNamespace, Name: lweppPod, Labels: map[string]string{"app": lweppAppLabel}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "model-server", Image: "laneway.dev/none"}}},
	}
	if err := c.Create(ctx, pod); err != nil {
		return fmt.Errorf("create pod %s/%s: %w", lweppNamespace, lweppPod, err)
	}
	pod.Status = corev1.PodStatus{
		Phase:      corev1.PodRunning,
		PodIP:      ip,
		PodIPs:     []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}},
	}
	if err := c.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("write status (Running, Ready, podIP %s) of pod %s/%s: %w", ip, lweppNamespace, lweppPod, err)
	}
	return nil
}

// writeAdminKubeconfig writes a kubeconfig with cfg's identity (envtest's
// admin user) to path.
func writeAdminKubeconfig(cfg *rest.Config, path string) error {
	const name = "envtest"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData,
		ClientKeyData:         cfg.KeyData,
		Token:                 cfg.BearerToken,
	}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name, Namespace: lweppNamespace}
	kc.CurrentContext = name
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("write lwepp kubeconfig %s: %w", path, err)
	}
	return nil
}

// waitLWEPPRoutes sends ext_proc requests to lwepp until one is routed to
// its endpoint. Until its pod reconciler has added the pod, lwepp fails
// the stream ("no pods available"); nothing announces the moment, so it
// polls with a deadline.
func waitLWEPPRoutes(ctx context.Context, l *LWEPP, useTLS bool) error {
	creds := insecure.NewCredentials()
	if useTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) //nolint:gosec // lwepp serves a self-signed certificate
	}
	conn, err := launch.Dial(l.GRPCAddr, creds)
	if err != nil {
		return err
	}
	defer conn.Close()
	c := extprocclient.New(conn, extprocclient.Options{})
	spec := specFor(&Config{PromptTokens: 16})
	return launch.Poll(ctx, l.Proc, "lwepp routing to "+l.Endpoint, lweppRouteTimeout, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, lweppProbeTimeout)
		defer cancel()
		ex, err := c.Start(ctx, spec)
		if err != nil {
			return err
		}
		defer ex.Close()
		d := ex.Decision()
		if !d.Routed() {
			return fmt.Errorf("answered directly with status %d", d.Immediate.Status)
		}
		if !slices.Equal(d.Endpoints, []string{l.Endpoint}) {
			return fmt.Errorf("routed to %v, want [%s]", d.Endpoints, l.Endpoint)
		}
		return nil
	})
}
