package edge

import (
	"strings"
	"testing"
	"time"
)

func TestConfig_ConnectionGuardFields(t *testing.T) {
	cfg, err := Parse([]byte(`
mqtt: {connect_timeout: 2s, max_connect_bytes: 8KiB, max_pending_connections: 10}
`))
	if err != nil {
		t.Fatal(err)
	}
	bc := cfg.BrokerConfig()
	if bc.ConnectTimeout != 2*time.Second || bc.MaxConnectSize != 8<<10 || bc.MaxPendingConnections != 10 {
		t.Fatalf("broker config = %v %d %d, want 2s 8192 10", bc.ConnectTimeout, bc.MaxConnectSize, bc.MaxPendingConnections)
	}

	cfg.MQTT.ConnectTimeout = 0
	cfg.MQTT.MaxPendingConnections = 0
	err = cfg.Validate()
	for _, want := range []string{"mqtt.connect_timeout", "mqtt.max_pending_connections"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want a problem naming %s", err, want)
		}
	}
}

func TestConfig_TopicAliases(t *testing.T) {
	cfg, err := Parse([]byte("mqtt: {topic_aliases: 0}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.BrokerConfig().TopicAliases; got != 0 {
		t.Fatalf("topic_aliases 0 reached the broker as %d", got)
	}
	cfg.MQTT.TopicAliases = 70000
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "mqtt.topic_aliases") {
		t.Fatalf("Validate() = %v, want a problem naming mqtt.topic_aliases", err)
	}
}

// mqtt.max_topic_levels reaches the broker, and a bound that is not
// positive is refused by its YAML name.
func TestConfig_MaxTopicLevels(t *testing.T) {
	cfg, err := Parse([]byte("mqtt: {max_topic_levels: 16}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.BrokerConfig().MaxTopicLevels; got != 16 {
		t.Fatalf("max_topic_levels 16 reached the broker as %d", got)
	}
	for _, bad := range []int{0, -1, 40000} {
		cfg.MQTT.MaxTopicLevels = bad
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "mqtt.max_topic_levels") {
			t.Fatalf("max_topic_levels %d: Validate() = %v, want a problem naming mqtt.max_topic_levels", bad, err)
		}
	}
}

func TestConfig_LoginAndPendingLimits(t *testing.T) {
	cfg, err := Parse([]byte("mqtt: {max_pending_per_address: 4, login_backoff: 50ms, max_login_backoff: 2s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	bc := cfg.BrokerConfig()
	if bc.MaxPendingPerAddress != 4 || bc.LoginBackoff != 50*time.Millisecond || bc.MaxLoginBackoff != 2*time.Second {
		t.Fatalf("broker config = %d %v %v, want 4 50ms 2s", bc.MaxPendingPerAddress, bc.LoginBackoff, bc.MaxLoginBackoff)
	}
	cfg.MQTT.MaxPendingPerAddress = 0
	cfg.MQTT.LoginBackoff = Duration(3 * time.Second)
	err = cfg.Validate()
	for _, want := range []string{"mqtt.max_pending_per_address", "mqtt.login_backoff"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want a problem naming %s", err, want)
		}
	}
}
