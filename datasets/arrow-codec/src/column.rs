//! The columns of an ingest table as plain vectors ([`Column`]): fixed-width values, strings
//! and bytes ([`Var`]), lists ([`List`]) and the `columns!` macro that makes a table (or a
//! struct column) from a list of named columns.

use std::sync::Arc;

use arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, Float64Array, ListArray, StringArray, UInt32Array,
    UInt64Array,
};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer, ToByteSlice};
use arrow_schema::{ArrowError, DataType, Field, FieldRef};

use crate::ipc::Piece;

/// A column of an ingest table as plain vectors, emptied (capacity kept) between calls.
pub trait Column: Default {
    /// Empties the column and makes room for `rows` rows.
    fn reset(&mut self, rows: usize);
    /// Its rows.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Its Arrow type (never nullable).
    fn data_type(&self) -> DataType;
    /// Its field nodes and buffers, in IPC order.
    fn pieces<'a>(&'a self, f: &mut dyn FnMut(Piece<'a>));
    /// The column as an `arrow-array` array (a copy).
    fn to_array(&self) -> Result<ArrayRef, ArrowError>;
    /// Whether its 32-bit offsets (if it has any) stayed in range.
    fn offsets_fit(&self) -> bool {
        true
    }
}

/// A fixed-width column's values: their bytes as they are in memory (little-endian).
pub(crate) fn bytes<T>(values: &[T]) -> Piece<'_>
where
    [T]: ToByteSlice,
{
    Piece::Bytes(values.to_byte_slice())
}

/// A boolean column's values: one bit each.
pub(crate) fn bits(values: &[bool]) -> Piece<'_> {
    Piece::Bits(values)
}

/// Fixed-width columns: a vector of values, its data buffer made by `$piece`.
macro_rules! primitive_column {
    ($($t:ty => $data_type:ident, $array:ident, $piece:ident;)*) => {$(
        impl Column for Vec<$t> {
            fn reset(&mut self, rows: usize) {
                self.clear();
                self.reserve(rows);
            }
            fn len(&self) -> usize {
                Vec::len(self)
            }
            fn data_type(&self) -> DataType {
                DataType::$data_type
            }
            fn pieces<'a>(&'a self, f: &mut dyn FnMut(Piece<'a>)) {
                f(Piece::Node(Vec::len(self)));
                f(Piece::NoValidity);
                f($piece(self));
            }
            fn to_array(&self) -> Result<ArrayRef, ArrowError> {
                Ok(Arc::new($array::from(self.clone())))
            }
        }
    )*};
}

primitive_column! {
    u32 => UInt32, UInt32Array, bytes;
    u64 => UInt64, UInt64Array, bytes;
    f64 => Float64, Float64Array, bytes;
    bool => Boolean, BooleanArray, bits;
}

/// Variable-length values (`utf8` when `UTF8`, else `binary`): offsets and bytes.
pub(crate) struct Var<const UTF8: bool> {
    pub(crate) offsets: Vec<i32>,
    pub(crate) data: Vec<u8>,
    /// Bytes a row to make room for.
    pub(crate) hint: usize,
}

pub(crate) type Utf8 = Var<true>;
pub(crate) type Binary = Var<false>;

impl<const UTF8: bool> Default for Var<UTF8> {
    fn default() -> Self {
        Self {
            offsets: vec![0],
            data: Vec::new(),
            hint: 16,
        }
    }
}

impl<const UTF8: bool> Var<UTF8> {
    pub(crate) fn with_hint(hint: usize) -> Self {
        Self {
            hint,
            ..Self::default()
        }
    }
    /// Appends one value. The byte count fits the offsets: `decode` bounds every column by
    /// the payloads' bytes, and `write_batch_message` checks it again.
    pub(crate) fn push(&mut self, value: &[u8]) {
        self.data.extend_from_slice(value);
        self.offsets.push(self.data.len() as i32);
    }
}

impl<const UTF8: bool> Column for Var<UTF8> {
    fn len(&self) -> usize {
        self.offsets.len() - 1
    }
    fn reset(&mut self, rows: usize) {
        self.offsets.clear();
        self.offsets.reserve(rows + 1);
        self.offsets.push(0);
        self.data.clear();
        self.data.reserve(rows * self.hint);
    }
    fn data_type(&self) -> DataType {
        if UTF8 {
            DataType::Utf8
        } else {
            DataType::Binary
        }
    }
    fn pieces<'a>(&'a self, f: &mut dyn FnMut(Piece<'a>)) {
        f(Piece::Node(self.len()));
        f(Piece::NoValidity);
        f(Piece::Bytes(self.offsets.to_byte_slice()));
        f(Piece::Bytes(&self.data));
    }
    fn to_array(&self) -> Result<ArrayRef, ArrowError> {
        let offsets = OffsetBuffer::new(ScalarBuffer::from(self.offsets.clone()));
        let data = Buffer::from_vec(self.data.clone());
        Ok(if UTF8 {
            Arc::new(StringArray::try_new(offsets, data, None)?)
        } else {
            Arc::new(BinaryArray::try_new(offsets, data, None)?)
        })
    }
    fn offsets_fit(&self) -> bool {
        self.data.len() <= i32::MAX as usize
    }
}

/// `list<item>` of any column (histogram buckets, path switch ids, INT hops), never null:
/// offsets, then the items as a column of their own.
pub struct List<C> {
    pub(crate) offsets: Vec<i32>,
    pub(crate) values: C,
    /// Items a row to make room for.
    pub(crate) per_row: usize,
}

pub(crate) type U64List = List<Vec<u64>>;

impl<C: Column> Default for List<C> {
    fn default() -> Self {
        Self {
            offsets: vec![0],
            values: C::default(),
            // 32 buckets a row (2^32 ns, 4 GB): more only grows the values.
            per_row: 32,
        }
    }
}

impl<C: Column> List<C> {
    pub(crate) fn with_per_row(per_row: usize) -> Self {
        Self {
            per_row,
            ..Self::default()
        }
    }
    /// Ends the current row's list (its items were appended to `values`). The item count fits
    /// the offsets: `decode` bounds it by the payloads' bytes (`write_batch_message` checks).
    pub(crate) fn close(&mut self) {
        self.offsets.push(self.values.len() as i32);
    }
    pub(crate) fn item(&self) -> FieldRef {
        // Items are never null, as in ClickHouse's Array(UInt64) or Array(Tuple(...)).
        Arc::new(Field::new_list_field(self.values.data_type(), false))
    }
}

impl<C: Column> Column for List<C> {
    fn reset(&mut self, rows: usize) {
        self.offsets.clear();
        self.offsets.reserve(rows + 1);
        self.offsets.push(0);
        self.values.reset(rows * self.per_row);
    }
    fn len(&self) -> usize {
        self.offsets.len() - 1
    }
    fn data_type(&self) -> DataType {
        DataType::List(self.item())
    }
    fn pieces<'a>(&'a self, f: &mut dyn FnMut(Piece<'a>)) {
        f(Piece::Node(self.len()));
        f(Piece::NoValidity);
        f(Piece::Bytes(self.offsets.to_byte_slice()));
        self.values.pieces(f);
    }
    fn to_array(&self) -> Result<ArrayRef, ArrowError> {
        let offsets = OffsetBuffer::new(ScalarBuffer::from(self.offsets.clone()));
        Ok(Arc::new(ListArray::try_new(
            self.item(),
            offsets,
            self.values.to_array()?,
            None,
        )?))
    }
    fn offsets_fit(&self) -> bool {
        self.values.len() <= i32::MAX as usize && self.values.offsets_fit()
    }
}

/// Columns as one struct (a Rust struct of columns, in the table's order): a record batch's
/// columns, or a `struct` column (ClickHouse's named `Tuple`). The struct, its reset, its
/// fields and its IPC pieces all come from the one list.
macro_rules! columns {
    ($(#[$meta:meta])* $vis:vis struct $name:ident {
        $($col:ident: $ty:ty $(= $init:expr)?,)*
    }) => {
        $(#[$meta])*
        $vis struct $name {
            rows: usize,
            $($col: $ty,)*
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    rows: 0,
                    $($col: columns!(@init $ty $(= $init)?),)*
                }
            }
        }

        impl $name {
            /// The columns' pieces, in order.
            fn column_pieces<'a>(&'a self, f: &mut dyn FnMut(Piece<'a>)) {
                $(self.$col.pieces(f);)*
            }

            fn fields(&self) -> Fields {
                Fields::from(vec![
                    $(Field::new(stringify!($col), self.$col.data_type(), false),)*
                ])
            }

            fn arrays(&self) -> Result<Vec<ArrayRef>, ArrowError> {
                Ok(vec![$(self.$col.to_array()?,)*])
            }
        }

        impl Column for $name {
            fn reset(&mut self, rows: usize) {
                self.rows = 0;
                $(self.$col.reset(rows);)*
            }
            fn len(&self) -> usize {
                self.rows
            }
            fn data_type(&self) -> DataType {
                DataType::Struct(self.fields())
            }
            fn pieces<'a>(&'a self, f: &mut dyn FnMut(Piece<'a>)) {
                f(Piece::Node(self.rows));
                f(Piece::NoValidity);
                self.column_pieces(f);
            }
            fn to_array(&self) -> Result<ArrayRef, ArrowError> {
                Ok(Arc::new(StructArray::try_new(self.fields(), self.arrays()?, None)?))
            }
            fn offsets_fit(&self) -> bool {
                true $(&& self.$col.offsets_fit())*
            }
        }
    };
    (@init $ty:ty = $init:expr) => { $init };
    (@init $ty:ty) => { <$ty>::default() };
}
