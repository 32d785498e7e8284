//! Welch's two-sample t-test (unequal variances), as pyperf's `compare_to` applies it to
//! benchmark runs: is the difference of two means larger than their runs' scatter explains?
//!
//! t = (mean_new - mean_base) / sqrt(var_base/n_base + var_new/n_new), with the
//! Welch-Satterthwaite degrees of freedom
//! df = (v_b/n_b + v_n/n_n)^2 / ((v_b/n_b)^2/(n_b-1) + (v_n/n_n)^2/(n_n-1))
//! (B. L. Welch, "The generalization of Student's problem when several different population
//! variances are involved", Biometrika 34, 1947). The two-sided p-value is
//! I_{df/(df+t^2)}(df/2, 1/2), the regularized incomplete beta function (Abramowitz & Stegun
//! 26.7.1), evaluated by its continued fraction (Numerical Recipes, 3rd ed., 6.4) with the
//! Lanczos log-gamma (ibid. 6.1). The 95% interval of the difference is
//! diff ± t_{0.975, df} * se, the quantile found by bisection on the distribution function.

/// The test's significance level: a p-value below it rejects "no change".
pub const ALPHA: f64 = 0.05;

/// Mean and sample variance (n - 1 in the denominator) of `values`; `None` for fewer than two.
pub fn mean_variance(values: &[f64]) -> Option<(f64, f64)> {
    if values.len() < 2 {
        return None;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let variance = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1.0);
    Some((mean, variance))
}

pub fn mean(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        None
    } else {
        Some(values.iter().sum::<f64>() / values.len() as f64)
    }
}

/// The outcome of Welch's test of `new` against `base`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Welch {
    /// mean(new) - mean(base).
    pub difference: f64,
    pub t: f64,
    pub degrees_of_freedom: f64,
    /// Two-sided.
    pub p_value: f64,
    /// The 95% confidence interval of `difference`.
    pub low: f64,
    pub high: f64,
}

/// Welch's test; `None` unless both sides have at least two values.
pub fn welch(base: &[f64], new: &[f64]) -> Option<Welch> {
    let (mean_base, var_base) = mean_variance(base)?;
    let (mean_new, var_new) = mean_variance(new)?;
    let (n_base, n_new) = (base.len() as f64, new.len() as f64);
    let difference = mean_new - mean_base;
    let a = var_base / n_base;
    let b = var_new / n_new;
    let se2 = a + b;
    if se2 <= 0.0 || !se2.is_finite() {
        // No scatter on either side (exact synthetic counts): any difference is certain.
        let p_value = if difference == 0.0 { 1.0 } else { 0.0 };
        return Some(Welch {
            difference,
            t: if difference == 0.0 {
                0.0
            } else {
                difference.signum() * f64::INFINITY
            },
            degrees_of_freedom: n_base + n_new - 2.0,
            p_value,
            low: difference,
            high: difference,
        });
    }
    let se = se2.sqrt();
    let t = difference / se;
    let df = se2 * se2 / (a * a / (n_base - 1.0) + b * b / (n_new - 1.0));
    let p_value = student_t_two_sided(t, df);
    let quantile = student_t_quantile(0.975, df);
    Some(Welch {
        difference,
        t,
        degrees_of_freedom: df,
        p_value,
        low: difference - quantile * se,
        high: difference + quantile * se,
    })
}

/// P(|T| >= |t|) for Student's t with `df` degrees of freedom.
pub fn student_t_two_sided(t: f64, df: f64) -> f64 {
    if !t.is_finite() {
        return 0.0;
    }
    incomplete_beta(df / 2.0, 0.5, df / (df + t * t)).clamp(0.0, 1.0)
}

/// The `p` quantile (0.5 < p < 1) of Student's t with `df` degrees of freedom.
pub fn student_t_quantile(p: f64, df: f64) -> f64 {
    // P(T <= x) = 1 - two_sided(x)/2 for x >= 0; increasing in x.
    let cdf = |x: f64| 1.0 - student_t_two_sided(x, df) / 2.0;
    let mut high = 1.0;
    while cdf(high) < p && high < 1e12 {
        high *= 2.0;
    }
    let mut low = 0.0;
    for _ in 0..200 {
        let middle = (low + high) / 2.0;
        if cdf(middle) < p {
            low = middle;
        } else {
            high = middle;
        }
    }
    (low + high) / 2.0
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, n = 9 coefficients).
fn ln_gamma(x: f64) -> f64 {
    const COEFFICIENTS: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1-x) = π / sin(πx).
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut sum = COEFFICIENTS[0];
    for (index, coefficient) in COEFFICIENTS.iter().enumerate().skip(1) {
        sum += coefficient / (x + index as f64);
    }
    let t = x + 7.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

/// The regularized incomplete beta function I_x(a, b).
pub fn incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front =
        (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    // The continued fraction converges fast for x < (a+1)/(a+b+2); use the symmetry
    // I_x(a,b) = 1 - I_{1-x}(b,a) otherwise.
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_fraction(a, b, x) / a
    } else {
        1.0 - front * beta_fraction(b, a, 1.0 - x) / b
    }
}

/// The continued fraction of the incomplete beta function, by the modified Lentz method.
fn beta_fraction(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    const EPSILON: f64 = 1e-15;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    // Numerical Recipes' FPMIN: keeps each denominator away from zero.
    let nonzero = |value: f64| if value.abs() < TINY { TINY } else { value };
    let mut c = 1.0;
    let mut d = 1.0 / nonzero(1.0 - qab * x / qap);
    let mut h = d;
    // One step of the recurrence with the next coefficient `aa`: the factor it brings to h.
    let mut step = |aa: f64| {
        d = 1.0 / nonzero(1.0 + aa * d);
        c = nonzero(1.0 + aa / c);
        d * c
    };
    for m in 1..=10_000 {
        let m = m as f64;
        let m2 = 2.0 * m;
        // The even coefficient d_2m, then the odd d_2m+1 (Numerical Recipes, 6.4).
        h *= step(m * (b - m) * x / ((qam + m2) * (a + m2)));
        let delta = step(-(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)));
        h *= delta;
        if (delta - 1.0).abs() < EPSILON {
            break;
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(actual: f64, expected: f64, tolerance: f64) {
        assert!(
            (actual - expected).abs() <= tolerance * expected.abs().max(1e-300),
            "{actual} != {expected}"
        );
    }

    /// Against scipy (values computed once with scipy 1.17.1, pasted below).
    #[test]
    fn welch_matches_scipy() {
        let base = [100.0, 102.0, 98.0, 101.0, 99.0];
        let new = [110.0, 108.0, 113.0, 109.0];
        let result = welch(&base, &new).unwrap();
        close(result.t, SCIPY_T, 1e-12);
        close(result.degrees_of_freedom, SCIPY_DF, 1e-12);
        close(result.p_value, SCIPY_P, 1e-9);
        close(result.low, SCIPY_LOW, 1e-9);
        close(result.high, SCIPY_HIGH, 1e-9);

        // Overlapping samples: not significant.
        let result = welch(&[10.0, 12.0, 9.0], &[11.0, 10.0, 13.0]).unwrap();
        close(result.t, SCIPY_T2, 1e-12);
        close(result.degrees_of_freedom, SCIPY_DF2, 1e-12);
        close(result.p_value, SCIPY_P2, 1e-9);
        assert!(result.p_value > ALPHA);
    }

    // scipy 1.17.1: `stats.ttest_ind(new, base, equal_var=False)` gives t and p; df is the
    // Welch-Satterthwaite formula on numpy's `var(ddof=1)`, and the interval
    // `diff -/+ stats.t.ppf(0.975, df) * se`.
    const SCIPY_T: f64 = 7.745966692414834;
    const SCIPY_DF: f64 = 5.381165919282512;
    const SCIPY_P: f64 = 0.0004090565933540803;
    const SCIPY_LOW: f64 = 6.750865184887557;
    const SCIPY_HIGH: f64 = 13.249134815112443;
    // `stats.ttest_ind([11, 10, 13], [10, 12, 9], equal_var=False)`.
    const SCIPY_T2: f64 = 0.8017837257372732;
    const SCIPY_DF2: f64 = 4.0;
    const SCIPY_P2: f64 = 0.4676047546093972;

    /// Hand-worked: base {1, 3} (mean 2, variance 2), new {5, 7} (mean 6, variance 2):
    /// se = sqrt(2/2 + 2/2) = sqrt 2, t = 4 / sqrt 2 = 2.828..., df = 4 / (1 + 1) = 2; with
    /// two degrees of freedom the t distribution has the closed form
    /// P(|T| >= t) = 1 - t / sqrt(2 + t^2), here 1 - 2.828/3.162 = 0.10557.
    #[test]
    fn welch_hand_worked() {
        let result = welch(&[1.0, 3.0], &[5.0, 7.0]).unwrap();
        close(result.t, 2.0f64.sqrt() * 2.0, 1e-15);
        close(result.degrees_of_freedom, 2.0, 1e-15);
        let t = result.t;
        close(result.p_value, 1.0 - t / (2.0 + t * t).sqrt(), 1e-12);
        // t_{0.975, 2} = 4.302652729911275 (closed form for df = 2: q = 2(2p-1)/sqrt(...)):
        // x = (2p - 1) * sqrt(2 / (1 - (2p-1)^2)).
        let q = 0.95 * (2.0f64 / (1.0 - 0.95 * 0.95)).sqrt();
        close(student_t_quantile(0.975, 2.0), q, 1e-9);
        // df = 1 is Cauchy: P(|T| >= 1) = 1/2.
        close(student_t_two_sided(1.0, 1.0), 0.5, 1e-12);
    }

    #[test]
    fn no_scatter_is_certain_and_too_few_runs_is_no_test() {
        let same = welch(&[5.0, 5.0], &[5.0, 5.0, 5.0]).unwrap();
        assert_eq!(same.p_value, 1.0);
        let shifted = welch(&[5.0, 5.0], &[10.0, 10.0]).unwrap();
        assert_eq!(shifted.p_value, 0.0);
        assert_eq!((shifted.low, shifted.high), (5.0, 5.0));
        assert!(welch(&[1.0], &[2.0, 3.0]).is_none());
        assert_eq!(mean_variance(&[2.0, 4.0, 6.0]), Some((4.0, 4.0)));
    }
}
