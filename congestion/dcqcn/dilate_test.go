package dcqcn

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/congestion"
)

func TestDilate(t *testing.T) {
	c := Paper(40 * congestion.Gbps).Dilate(400)
	if c.LineRate != 100*congestion.Mbps || c.AIRate != 100*congestion.Kbps || c.MinRate != 2500*congestion.BitPerSecond {
		t.Fatalf("rates not divided by 400: line %v ai %v min %v", c.LineRate, c.AIRate, c.MinRate)
	}
	if c.TimerPeriod != 22*time.Millisecond || c.AlphaPeriod != 22*time.Millisecond || c.ByteCounter != 10_000_000 {
		t.Fatalf("periods or bytes wrong: T %v K %v B %v", c.TimerPeriod, c.AlphaPeriod, c.ByteCounter)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if n := PaperNP().Dilate(400); n.MinInterval != 20*time.Millisecond || n.DSCP != 48 {
		t.Fatalf("NP dilated wrong: %+v", n)
	}
	if c := Paper(40 * congestion.Gbps).Dilate(0); c != Paper(40*congestion.Gbps) {
		t.Fatal("scale 0 changed the config")
	}
}
