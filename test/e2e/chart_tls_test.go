package e2e

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestChartMutualTLS: epp.clientCA mounts the bundle from its Secret or
// ConfigMap as a whole volume (a subPath mount never sees an update) and
// passes --client-ca with the file inside it; without it there is neither.
func TestChartMutualTLS(t *testing.T) {
	tests := []struct {
		name string
		set  []string
		// want is the --client-ca value, "" for none; source the volume's
		// Secret or ConfigMap name.
		want, source string
		configMap    bool
	}{
		{name: "off"},
		{name: "secret", set: []string{"epp.clientCA.secret=gateway-ca"}, want: "/etc/laneway/client-ca/ca.crt", source: "gateway-ca"},
		{name: "configmap", set: []string{"epp.clientCA.configMap=trust-bundle", "epp.clientCA.key=gateways.pem"},
			want: "/etc/laneway/client-ca/gateways.pem", source: "trust-bundle", configMap: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, renderArgs{release: "lw", namespace: "pool-ns", set: tc.set})
			dep := fromUnstructured[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "lw-laneway"))
			pod := dep.Spec.Template.Spec
			c := pod.Containers[0]
			var got []string
			for _, a := range c.Args {
				if v, ok := strings.CutPrefix(a, "--client-ca="); ok {
					got = append(got, v)
				}
			}
			if tc.want == "" {
				if len(got) != 0 {
					t.Errorf("--client-ca %v without epp.clientCA", got)
				}
				return
			}
			if !slices.Equal(got, []string{tc.want}) {
				t.Fatalf("--client-ca %v, want [%s]", got, tc.want)
			}
			var vol *corev1.Volume
			for i := range pod.Volumes {
				v := &pod.Volumes[i]
				if (tc.configMap && v.ConfigMap != nil && v.ConfigMap.Name == tc.source) || (!tc.configMap && v.Secret != nil && v.Secret.SecretName == tc.source) {
					vol = v
				}
			}
			if vol == nil {
				t.Fatalf("no volume from %s in %+v", tc.source, pod.Volumes)
			}
			var mounted bool
			for _, m := range c.VolumeMounts {
				if m.Name == vol.Name {
					mounted = true
					if m.SubPath != "" || !m.ReadOnly || !strings.HasPrefix(tc.want, m.MountPath+"/") {
						t.Errorf("bundle mount %+v: want the whole volume, read-only, holding %s", m, tc.want)
					}
				}
			}
			if !mounted {
				t.Errorf("volume %s is not mounted", vol.Name)
			}
		})
	}
}
