//go:build !unix

package codec

import "time"

// processCPU is not measured here: cpu-ms/region-epoch reads 0.
func processCPU() time.Duration { return 0 }
