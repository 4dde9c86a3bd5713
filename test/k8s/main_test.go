package k8s

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/laneway-dev/laneway/internal/testbed/launch"
	"github.com/laneway-dev/laneway/internal/testbed/testenv"
	"github.com/laneway-dev/laneway/internal/tlsutil"
)

// Shared by every test: the API server (as cluster admin, for the test's
// own writes) and the picker binary.
var (
	// cluster is the control plane; the outage test stops and restarts
	// its API server.
	cluster    *testenv.Env
	adminCfg   *rest.Config
	admin      client.Client
	kube       kubernetes.Interface
	bins       launch.Binaries
	skipReason string // set when the envtest binaries are absent
	// replicaIdentity is the folder of the replicas' identity
	// (--replica-cert-path): one CA and one certificate for every
	// replica, as the chart's Secret.
	replicaIdentity string
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "laneway-k8s-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "k8s suite: temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	replicaIdentity = filepath.Join(dir, "replica")
	if err := writeReplicaIdentity(replicaIdentity); err != nil {
		fmt.Fprintln(os.Stderr, "k8s suite: replica identity:", err)
		return 1
	}

	// The build and the API server start take seconds each; overlap them.
	built := make(chan error, 1)
	go func() {
		var err error
		// With the race detector when launch.RaceEnv asks: a data race in
		// the controllers under these workloads then fails the suite.
		bins, err = launch.Build(dir, launch.RaceFromEnv(), launch.CmdEpp, launch.CmdGateway, launch.CmdModelsim)
		built <- err
	}()
	cluster, err = testenv.StartEnv()
	if errors.Is(err, testenv.ErrNoAssets) {
		<-built
		skipReason = err.Error()
		return m.Run()
	}
	if err != nil {
		<-built
		fmt.Fprintln(os.Stderr, "k8s suite:", err)
		return 1
	}
	defer func() {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "k8s suite: stop envtest:", err)
		}
	}()
	if err := <-built; err != nil {
		fmt.Fprintln(os.Stderr, "k8s suite:", err)
		return 1
	}
	scheme, err := testenv.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, "k8s suite:", err)
		return 1
	}
	adminCfg = cluster.Config
	if admin, err = client.New(adminCfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, "k8s suite: admin client:", err)
		return 1
	}
	if kube, err = kubernetes.NewForConfig(adminCfg); err != nil {
		fmt.Fprintln(os.Stderr, "k8s suite: clientset:", err)
		return 1
	}
	return m.Run()
}

// requireEnv skips the test, in one line, when envtest is not available.
func requireEnv(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}

// writeReplicaIdentity writes a new CA's replica identity into dir.
func writeReplicaIdentity(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, err := tlsutil.NewCA("laneway k8s suite replicas")
	if err != nil {
		return err
	}
	return ca.WriteReplica(dir, "laneway-epp")
}
