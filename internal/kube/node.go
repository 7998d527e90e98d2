package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
)

// fieldManager names the provider in the managed fields of what it writes.
const fieldManager = "provider-kubernetes"

// NodeCondition is one condition of a Node's status.
type NodeCondition struct {
	Type               string
	Status             string // True, False or Unknown
	Reason             string
	Message            string
	LastHeartbeatTime  time.Time
	LastTransitionTime time.Time
}

// nodeCondition is a condition as the API carries it.
type nodeCondition struct {
	Type               string      `json:"type"`
	Status             string      `json:"status"`
	Reason             string      `json:"reason,omitempty"`
	Message            string      `json:"message,omitempty"`
	LastHeartbeatTime  metav1.Time `json:"lastHeartbeatTime"`
	LastTransitionTime metav1.Time `json:"lastTransitionTime"`
}

// NodeConditions reads a Node's conditions (a node's own credentials may
// read its own Node).
func (c *Client) NodeConditions(ctx context.Context, name string) ([]NodeCondition, error) {
	var n struct {
		Status struct {
			Conditions []nodeCondition `json:"conditions"`
		} `json:"status"`
	}
	if err := c.get(ctx, "", "", "nodes", name, &n); err != nil {
		return nil, fmt.Errorf("get node %s: %w", shown(name), err)
	}
	out := make([]NodeCondition, 0, len(n.Status.Conditions))
	for _, x := range n.Status.Conditions {
		out = append(out, NodeCondition{Type: x.Type, Status: x.Status, Reason: x.Reason, Message: x.Message,
			LastHeartbeatTime: x.LastHeartbeatTime.Time, LastTransitionTime: x.LastTransitionTime.Time})
	}
	return out, nil
}

// SetNodeCondition puts one condition on a Node's status subresource: a
// strategic merge patch of nodes/NAME/status, whose conditions merge by
// type, so the Node's other conditions (the kubelet's Ready and pressure
// conditions) are left as they are. A node's own credentials may patch
// its own Node's status (the Node authorizer allows patch on nodes/status,
// the NodeRestriction admission limits it to the node's own Node).
func (c *Client) SetNodeCondition(ctx context.Context, node string, cond NodeCondition) error {
	if err := checkName("node", node); err != nil {
		return fmt.Errorf("set node condition: %w", err)
	}
	x := nodeCondition{Type: cond.Type, Status: cond.Status, Reason: cond.Reason, Message: cond.Message,
		LastHeartbeatTime: metav1.NewTime(cond.LastHeartbeatTime), LastTransitionTime: metav1.NewTime(cond.LastTransitionTime)}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []nodeCondition{x}}})
	if err != nil {
		return err
	}
	b, err := raw(c.core.Patch(types.StrategicMergePatchType).Resource("nodes").Name(node).SubResource("status").
		Param("fieldManager", fieldManager).Timeout(c.timeout).Body(patch).Do(ctx))
	if err == nil {
		err = statusInBody(b)
	}
	if err != nil {
		return fmt.Errorf("set condition %s on node %s: %w", cond.Type, node, err)
	}
	return nil
}

// Cordon marks a Node unschedulable (spec.unschedulable, as kubectl
// cordon does) or, with unschedulable false, schedulable again, and
// reports whether it was unschedulable before. A node's own credentials
// may do it to their own Node (the NodeRestriction admission forbids a
// node its taints, not spec.unschedulable).
func (c *Client) Cordon(ctx context.Context, node string, unschedulable bool) (was bool, err error) {
	var n struct {
		Spec struct {
			Unschedulable bool `json:"unschedulable"`
		} `json:"spec"`
	}
	if err := c.get(ctx, "", "", "nodes", node, &n); err != nil {
		return false, fmt.Errorf("get node %s: %w", shown(node), err)
	}
	if n.Spec.Unschedulable == unschedulable {
		return n.Spec.Unschedulable, nil
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"unschedulable": unschedulable}})
	if err != nil {
		return false, err
	}
	b, err := raw(c.core.Patch(types.MergePatchType).Resource("nodes").Name(node).Param("fieldManager", fieldManager).
		Timeout(c.timeout).Body(patch).Do(ctx))
	if err == nil {
		err = statusInBody(b)
	}
	if err != nil {
		verb := "cordon"
		if !unschedulable {
			verb = "uncordon"
		}
		return n.Spec.Unschedulable, fmt.Errorf("%s node %s: %w", verb, node, err)
	}
	return n.Spec.Unschedulable, nil
}

// NodePod is what a drain reads of a pod bound to a Node.
type NodePod struct {
	Namespace, Name, UID string
	Labels               map[string]string
	// Mirror: the kubelet's mirror of a static pod (the
	// kubernetes.io/config.mirror annotation); the kubelet owns it.
	Mirror bool
	// Controller is the kind of the pod's controlling owner ("DaemonSet",
	// "ReplicaSet", ...; "" when it has none).
	Controller string
	// Terminating: its deletion has started (deletionTimestamp set).
	Terminating bool
	Phase       string // Pending, Running, Succeeded, Failed, Unknown
}

// String is the pod as namespace/name.
func (p NodePod) String() string { return p.Namespace + "/" + p.Name }

// mirrorAnnotation marks a mirror pod (k8s.io/api/core/v1 MirrorPodAnnotationKey).
const mirrorAnnotation = "kubernetes.io/config.mirror"

// PodsOn lists the pods bound to a Node (the field selector
// spec.nodeName=NODE, which is also the one list of pods the Node
// authorizer allows a node's own credentials).
func (c *Client) PodsOn(ctx context.Context, node string) ([]NodePod, error) {
	if err := checkName("node", node); err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	type pod struct {
		Metadata struct {
			Namespace         string            `json:"namespace"`
			Name              string            `json:"name"`
			UID               string            `json:"uid"`
			Labels            map[string]string `json:"labels"`
			Annotations       map[string]string `json:"annotations"`
			DeletionTimestamp *metav1.Time      `json:"deletionTimestamp"`
			OwnerReferences   []struct {
				Kind       string `json:"kind"`
				Controller *bool  `json:"controller"`
			} `json:"ownerReferences"`
		} `json:"metadata"`
		Status struct {
			Phase string `json:"phase"`
		} `json:"status"`
	}
	items, err := list[pod](ctx, "pods", func() *rest.Request {
		return c.core.Get().Resource("pods").Param("fieldSelector", "spec.nodeName="+node).Timeout(c.timeout)
	})
	if err != nil {
		return nil, fmt.Errorf("list the pods on node %s via %s: %w", node, c.Kubeconfig, err)
	}
	out := make([]NodePod, 0, len(items))
	for _, p := range items {
		m := p.Metadata
		np := NodePod{Namespace: m.Namespace, Name: m.Name, UID: m.UID, Labels: m.Labels, Terminating: m.DeletionTimestamp != nil, Phase: p.Status.Phase}
		_, np.Mirror = m.Annotations[mirrorAnnotation]
		for _, o := range m.OwnerReferences {
			if o.Controller != nil && *o.Controller {
				np.Controller = o.Kind
			}
		}
		out = append(out, np)
	}
	return out, nil
}

// Evict asks the Eviction API (policy/v1, the pods/eviction subresource)
// to evict a pod, only that very pod (its uid as the precondition: a pod
// recreated under the same name is not evicted by an old request). The
// apiserver answers 429 TooManyRequests while a PodDisruptionBudget does
// not allow it (apierrors.IsTooManyRequests; DisruptionBudgetCauses names
// the budget).
func (c *Client) Evict(ctx context.Context, p NodePod) error {
	if err := checkName("namespace", p.Namespace); err != nil {
		return fmt.Errorf("evict: %w", err)
	}
	if err := checkName("pod", p.Name); err != nil {
		return fmt.Errorf("evict: %w", err)
	}
	uid := types.UID(p.UID)
	ev := map[string]any{"apiVersion": "policy/v1", "kind": "Eviction",
		"metadata":      map[string]string{"name": p.Name, "namespace": p.Namespace},
		"deleteOptions": metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}}
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	b, err := raw(c.core.Post().Namespace(p.Namespace).Resource("pods").Name(p.Name).SubResource("eviction").
		Timeout(c.timeout).SetHeader("Content-Type", "application/json").Body(body).Do(ctx))
	if err == nil {
		err = statusInBody(b)
	}
	return err
}

// DisruptionBudget is what a drain reads of a PodDisruptionBudget.
type DisruptionBudget struct {
	Namespace, Name    string
	MinAvailable       string // as written: a count or a percentage; "" unset
	MaxUnavailable     string
	DisruptionsAllowed int32
	CurrentHealthy     int32
	DesiredHealthy     int32
	ExpectedPods       int32
	selector           labels.Selector
}

// Selects reports whether the budget covers a pod with these labels, by
// the rule the eviction subresource applies (a budget with no selector
// covers none, an empty one every pod of its namespace).
func (d DisruptionBudget) Selects(podLabels map[string]string) bool {
	return d.selector != nil && d.selector.Matches(labels.Set(podLabels))
}

// DisruptionBudgets lists the PodDisruptionBudgets of a namespace (needs
// list on poddisruptionbudgets: a node's own credentials do not have it).
func (c *Client) DisruptionBudgets(ctx context.Context, namespace string) ([]DisruptionBudget, error) {
	if err := checkName("namespace", namespace); err != nil {
		return nil, fmt.Errorf("list disruption budgets: %w", err)
	}
	type pdb struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			MinAvailable   *intstr.IntOrString   `json:"minAvailable"`
			MaxUnavailable *intstr.IntOrString   `json:"maxUnavailable"`
			Selector       *metav1.LabelSelector `json:"selector"`
		} `json:"spec"`
		Status struct {
			DisruptionsAllowed int32 `json:"disruptionsAllowed"`
			CurrentHealthy     int32 `json:"currentHealthy"`
			DesiredHealthy     int32 `json:"desiredHealthy"`
			ExpectedPods       int32 `json:"expectedPods"`
		} `json:"status"`
	}
	items, err := list[pdb](ctx, "poddisruptionbudgets", func() *rest.Request {
		return c.policy.Get().Namespace(namespace).Resource("poddisruptionbudgets").Timeout(c.timeout)
	})
	if err != nil {
		return nil, fmt.Errorf("list the PodDisruptionBudgets of namespace %s via %s: %w", namespace, c.Kubeconfig, err)
	}
	out := make([]DisruptionBudget, 0, len(items))
	for _, p := range items {
		d := DisruptionBudget{Namespace: namespace, Name: p.Metadata.Name, MinAvailable: intOrString(p.Spec.MinAvailable),
			MaxUnavailable: intOrString(p.Spec.MaxUnavailable), DisruptionsAllowed: p.Status.DisruptionsAllowed,
			CurrentHealthy: p.Status.CurrentHealthy, DesiredHealthy: p.Status.DesiredHealthy, ExpectedPods: p.Status.ExpectedPods}
		if sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector); err == nil {
			d.selector = sel
		}
		out = append(out, d)
	}
	return out, nil
}

// intOrString is an IntOrString as written ("2", "50%"), "" when unset.
func intOrString(v *intstr.IntOrString) string {
	if v == nil {
		return ""
	}
	return v.String()
}

// DisruptionBudgetCauses are the causes an eviction's refusal gives for a
// PodDisruptionBudget (each names the budget: "The disruption budget web
// needs 2 healthy pods and has 2 currently"), as the apiserver wrote them.
func DisruptionBudgetCauses(err error) []string {
	var out []string
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		if d := st.Status().Details; d != nil {
			for _, c := range d.Causes {
				if c.Type == disruptionBudgetCause {
					out = append(out, c.Message)
				}
			}
		}
	}
	return out
}

// disruptionBudgetCause is k8s.io/api/policy/v1 DisruptionBudgetCause.
const disruptionBudgetCause metav1.CauseType = "DisruptionBudget"

// IsForbidden reports an apiserver's answer that the credentials may not
// do what was asked.
func IsForbidden(err error) bool { return apierrors.IsForbidden(err) }
