package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of every kind in this package.
var GroupVersion = schema.GroupVersion{Group: "laneway.dev", Version: "v1alpha1"}

var (
	// SchemeBuilder collects the functions that register this package's
	// kinds with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme registers PolicyClass and PolicyProfile (and their lists)
	// with a scheme, so clients can encode and decode them.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&PolicyClass{}, &PolicyClassList{},
		&PolicyProfile{}, &PolicyProfileList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
