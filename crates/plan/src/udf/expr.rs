//! Arrow compute expressions for `filter`, `select` and `with_column`,
//! evaluated a whole batch at a time by Arrow's kernels.

use std::fmt;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{
    Array, ArrayRef, BooleanArray, Datum, Float64Array, Int64Array, RecordBatch, Scalar,
    StringArray,
};
use arrow_schema::{ArrowError, DataType};

/// A column expression.
///
/// ```
/// use streambatch_plan::{col, lit};
/// let e = col("score").gt(lit(0.5)).and((col("id") % lit(7)).lt_eq(lit(3)));
/// assert_eq!(e.to_string(), "((score > 0.5) AND ((id % 7) <= 3))");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// A column by name.
    Column(String),
    /// A constant.
    Literal(Literal),
    /// A binary operation.
    Binary(Box<Expr>, BinaryOp, Box<Expr>),
    /// Logical negation.
    Not(Box<Expr>),
    /// True where the operand is null.
    IsNull(Box<Expr>),
}

/// A constant value in an expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Literal {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
}

/// Operators of [`Expr::Binary`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum BinaryOp {
    Eq,
    NotEq,
    Lt,
    LtEq,
    Gt,
    GtEq,
    And,
    Or,
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

/// The column `name`.
pub fn col(name: &str) -> Expr {
    Expr::Column(name.to_string())
}

/// A constant.
pub fn lit(value: impl Into<Literal>) -> Expr {
    Expr::Literal(value.into())
}

impl From<bool> for Literal {
    fn from(v: bool) -> Self {
        Literal::Bool(v)
    }
}
impl From<i64> for Literal {
    fn from(v: i64) -> Self {
        Literal::Int(v)
    }
}
impl From<i32> for Literal {
    fn from(v: i32) -> Self {
        Literal::Int(v.into())
    }
}
impl From<f64> for Literal {
    fn from(v: f64) -> Self {
        Literal::Float(v)
    }
}
impl From<&str> for Literal {
    fn from(v: &str) -> Self {
        Literal::Str(v.to_string())
    }
}

macro_rules! binary_methods {
    ($($name:ident => $op:ident),*) => {$(
        #[doc = concat!("`self ", stringify!($name), " other`.")]
        pub fn $name(self, other: Expr) -> Expr {
            Expr::Binary(Box::new(self), BinaryOp::$op, Box::new(other))
        }
    )*};
}

impl Expr {
    binary_methods!(eq => Eq, not_eq => NotEq, lt => Lt, lt_eq => LtEq, gt => Gt, gt_eq => GtEq,
        and => And, or => Or);

    /// Logical negation.
    #[allow(clippy::should_implement_trait)]
    pub fn not(self) -> Expr {
        Expr::Not(Box::new(self))
    }

    /// True where `self` is null.
    pub fn is_null(self) -> Expr {
        Expr::IsNull(Box::new(self))
    }

    /// The name a `select` gives this expression's column.
    pub fn output_name(&self) -> String {
        match self {
            Expr::Column(name) => name.clone(),
            other => other.to_string(),
        }
    }

    /// Evaluates over `batch`, giving one value per row.
    pub fn evaluate(&self, batch: &RecordBatch) -> Result<ArrayRef, ArrowError> {
        match self.eval(batch)? {
            Operand::Array(a) => Ok(a),
            Operand::Scalar(s) => {
                let (array, _) = s.get();
                let indices = arrow_array::UInt32Array::from(vec![0u32; batch.num_rows()]);
                arrow_select::take::take(array, &indices, None)
            }
        }
    }

    /// Evaluates a predicate: a boolean per row, null counting as false.
    pub fn evaluate_predicate(&self, batch: &RecordBatch) -> Result<BooleanArray, ArrowError> {
        let array = self.evaluate(batch)?;
        let mask = booleans(&array, || format!("filter `{self}`"))?;
        Ok(match mask.nulls() {
            Some(_) => arrow_select::filter::prep_null_mask_filter(mask),
            None => mask.clone(),
        })
    }

    fn eval(&self, batch: &RecordBatch) -> Result<Operand, ArrowError> {
        Ok(match self {
            Expr::Column(name) => {
                let column = batch.column_by_name(name).ok_or_else(|| {
                    let names: Vec<_> = batch
                        .schema()
                        .fields()
                        .iter()
                        .map(|f| f.name().clone())
                        .collect();
                    ArrowError::SchemaError(format!(
                        "no column `{name}` (columns: {})",
                        names.join(", ")
                    ))
                })?;
                Operand::Array(column.clone())
            }
            Expr::Literal(l) => Operand::Scalar(l.to_scalar()),
            Expr::Not(e) => {
                let operand = e.evaluate(batch)?;
                let operand = booleans(&operand, || format!("NOT {e}: {e}"))?;
                Operand::Array(Arc::new(arrow_arith::boolean::not(operand)?))
            }
            Expr::IsNull(e) => Operand::Array(Arc::new(arrow_arith::boolean::is_null(
                &e.evaluate(batch)?,
            )?)),
            Expr::Binary(l, op, r) => {
                let (l, r) = coerce(l.eval(batch)?, r.eval(batch)?)?;
                Operand::Array(apply(*op, &l, &r)?)
            }
        })
    }
}

/// `array` as booleans, or an error saying that `what` is not boolean.
fn booleans(array: &ArrayRef, what: impl FnOnce() -> String) -> Result<&BooleanArray, ArrowError> {
    array.as_boolean_opt().ok_or_else(|| {
        ArrowError::InvalidArgumentError(format!(
            "{} is of type {}, not boolean",
            what(),
            array.data_type()
        ))
    })
}

macro_rules! arithmetic {
    ($($trait:ident::$method:ident => $op:ident),*) => {$(
        impl std::ops::$trait for Expr {
            type Output = Expr;
            fn $method(self, other: Expr) -> Expr {
                Expr::Binary(Box::new(self), BinaryOp::$op, Box::new(other))
            }
        }
    )*};
}
arithmetic!(Add::add => Add, Sub::sub => Sub, Mul::mul => Mul, Div::div => Div, Rem::rem => Rem);

enum Operand {
    Array(ArrayRef),
    Scalar(Scalar<ArrayRef>),
}

impl Operand {
    fn data_type(&self) -> DataType {
        match self {
            Operand::Array(a) => a.data_type().clone(),
            Operand::Scalar(s) => s.get().0.data_type().clone(),
        }
    }

    fn cast(self, to: &DataType) -> Result<Operand, ArrowError> {
        if &self.data_type() == to {
            return Ok(self);
        }
        Ok(match self {
            Operand::Array(a) => Operand::Array(arrow_cast::cast(&a, to)?),
            Operand::Scalar(s) => Operand::Scalar(Scalar::new(arrow_cast::cast(s.get().0, to)?)),
        })
    }

    fn datum(&self) -> &dyn Datum {
        match self {
            Operand::Array(a) => a,
            Operand::Scalar(s) => s,
        }
    }
}

/// Brings both operands to one type: a literal takes the column's type;
/// two different numeric types meet at Float64.
fn coerce(l: Operand, r: Operand) -> Result<(Operand, Operand), ArrowError> {
    let (lt, rt) = (l.data_type(), r.data_type());
    if lt == rt {
        return Ok((l, r));
    }
    match (&l, &r) {
        (Operand::Array(_), Operand::Scalar(_)) if !(lt.is_integer() && rt.is_floating()) => {
            Ok((l, r.cast(&lt)?))
        }
        (Operand::Scalar(_), Operand::Array(_)) if !(rt.is_integer() && lt.is_floating()) => {
            Ok((l.cast(&rt)?, r))
        }
        _ if lt.is_numeric() && rt.is_numeric() => {
            Ok((l.cast(&DataType::Float64)?, r.cast(&DataType::Float64)?))
        }
        _ => Err(ArrowError::InvalidArgumentError(format!(
            "cannot combine {lt} with {rt}"
        ))),
    }
}

fn apply(op: BinaryOp, l: &Operand, r: &Operand) -> Result<ArrayRef, ArrowError> {
    use arrow_arith::numeric;
    use arrow_ord::cmp;
    let (l, r) = (l.datum(), r.datum());
    let boolean = |a: BooleanArray| -> ArrayRef { Arc::new(a) };
    Ok(match op {
        BinaryOp::Eq => boolean(cmp::eq(l, r)?),
        BinaryOp::NotEq => boolean(cmp::neq(l, r)?),
        BinaryOp::Lt => boolean(cmp::lt(l, r)?),
        BinaryOp::LtEq => boolean(cmp::lt_eq(l, r)?),
        BinaryOp::Gt => boolean(cmp::gt(l, r)?),
        BinaryOp::GtEq => boolean(cmp::gt_eq(l, r)?),
        BinaryOp::And | BinaryOp::Or => {
            let (la, ra) = (to_array(l)?, to_array(r)?);
            let (la, ra) = (la.as_boolean(), ra.as_boolean());
            let f = if op == BinaryOp::And {
                arrow_arith::boolean::and_kleene
            } else {
                arrow_arith::boolean::or_kleene
            };
            boolean(f(la, ra)?)
        }
        BinaryOp::Add => numeric::add(l, r)?,
        BinaryOp::Sub => numeric::sub(l, r)?,
        BinaryOp::Mul => numeric::mul(l, r)?,
        BinaryOp::Div => numeric::div(l, r)?,
        BinaryOp::Rem => numeric::rem(l, r)?,
    })
}

/// And/or have no scalar kernels: a scalar side is spread to the other's length.
fn to_array(d: &dyn Datum) -> Result<ArrayRef, ArrowError> {
    let (array, is_scalar) = d.get();
    if !array.data_type().eq(&DataType::Boolean) {
        return Err(ArrowError::InvalidArgumentError(format!(
            "AND/OR need booleans, found {}",
            array.data_type()
        )));
    }
    if is_scalar {
        return Err(ArrowError::InvalidArgumentError(
            "AND/OR with a constant: write the constant's effect out".into(),
        ));
    }
    Ok(arrow_array::make_array(array.to_data()))
}

impl Literal {
    fn to_scalar(&self) -> Scalar<ArrayRef> {
        let array: ArrayRef = match self {
            Literal::Bool(v) => Arc::new(BooleanArray::from(vec![*v])),
            Literal::Int(v) => Arc::new(Int64Array::from(vec![*v])),
            Literal::Float(v) => Arc::new(Float64Array::from(vec![*v])),
            Literal::Str(v) => Arc::new(StringArray::from(vec![v.as_str()])),
        };
        Scalar::new(array)
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Column(name) => write!(f, "{name}"),
            Expr::Literal(Literal::Bool(v)) => write!(f, "{v}"),
            Expr::Literal(Literal::Int(v)) => write!(f, "{v}"),
            Expr::Literal(Literal::Float(v)) => write!(f, "{v}"),
            Expr::Literal(Literal::Str(v)) => write!(f, "'{v}'"),
            Expr::Not(e) => write!(f, "NOT {e}"),
            Expr::IsNull(e) => write!(f, "{e} IS NULL"),
            Expr::Binary(l, op, r) => {
                let sym = match op {
                    BinaryOp::Eq => "=",
                    BinaryOp::NotEq => "!=",
                    BinaryOp::Lt => "<",
                    BinaryOp::LtEq => "<=",
                    BinaryOp::Gt => ">",
                    BinaryOp::GtEq => ">=",
                    BinaryOp::And => "AND",
                    BinaryOp::Or => "OR",
                    BinaryOp::Add => "+",
                    BinaryOp::Sub => "-",
                    BinaryOp::Mul => "*",
                    BinaryOp::Div => "/",
                    BinaryOp::Rem => "%",
                };
                write!(f, "({l} {sym} {r})")
            }
        }
    }
}
