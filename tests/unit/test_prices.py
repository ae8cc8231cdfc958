"""tuning.prices: a volume's monthly cost at the dated us-east-1 list prices."""

from __future__ import annotations

import pytest

from tuning.ebs import VOLUME_TYPES, Volume
from tuning.prices import PRICE_PER_GB_MONTH, PRICES_AS_OF, PRICES_REGION, monthly_cost


def test_monthly_cost_uses_documented_prices() -> None:
    assert PRICES_REGION == "us-east-1" and PRICES_AS_OF
    assert monthly_cost(Volume("st1", 500)) == pytest.approx(22.50)
    assert monthly_cost(Volume("sc1", 500)) == pytest.approx(7.50)
    assert monthly_cost(Volume("gp2", 100)) == pytest.approx(10.00)
    # gp3: 100 GiB + 1000 IOPS and 125 MiB/s above the free baseline.
    assert monthly_cost(Volume("gp3", 100, iops=4000, throughput_mibps=250)) == pytest.approx(8 + 5 + 5)
    # io2: tiered IOPS.
    assert monthly_cost(Volume("io2", 100, iops=40_000)) == pytest.approx(12.5 + 32_000 * 0.065 + 8_000 * 0.0455)


def test_every_volume_kind_has_a_price() -> None:
    assert set(PRICE_PER_GB_MONTH) == set(VOLUME_TYPES)
    # io1: storage plus a flat price per provisioned IOPS.
    assert monthly_cost(Volume("io1", 100, iops=4000)) == pytest.approx(12.5 + 4000 * 0.065)
