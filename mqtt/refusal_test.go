package mqtt

import (
	"fmt"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

// A publisher is told the refusal's own words with the code of the
// sentinel it wraps, however deep the wrapping.
func TestRefusalCode_ReasonOfARefusal(t *testing.T) {
	err := fmt.Errorf("cluster: append to s: %w", Refuse("this node is cut off from the site's controller", ErrLeaderUnavailable))
	got := refusalCode(err)
	if got.Code != packets.ErrUnspecifiedError.Code || got.Reason != "not stored: this node is cut off from the site's controller" {
		t.Fatalf("refusalCode = %#x %q", got.Code, got.Reason)
	}
	got = refusalCode(Refuse("two of three replicas unreachable", ErrNotEnoughReplicas))
	if got.Code != packets.ErrQuotaExceeded.Code || got.Reason != "not stored: two of three replicas unreachable" {
		t.Fatalf("refusalCode = %#x %q", got.Code, got.Reason)
	}
	if got := refusalCode(ErrLeaderUnavailable); got.Reason != "not stored: stream leader unavailable" {
		t.Fatalf("plain sentinel: %q", got.Reason)
	}
}
